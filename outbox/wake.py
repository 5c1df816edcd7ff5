"""The wake signal: after commit, tell the relay there is something to send.

Only an accelerator. A lost signal loses nothing (the relay also sweeps), so
Redis being slow or down is logged and never fails the caller.
"""

from __future__ import annotations

import logging
import threading

import redis
from django.conf import settings
from django.db import transaction

logger = logging.getLogger("hubdommed.outbox")

_clients: dict[str, redis.Redis] = {}
_clients_lock = threading.Lock()


def redis_client() -> redis.Redis:
    """A shared client for ``settings.REDIS_URL`` with short timeouts."""
    url = settings.REDIS_URL
    client = _clients.get(url)
    if client is None:
        with _clients_lock:
            client = _clients.get(url)
            if client is None:
                client = redis.Redis.from_url(
                    url,
                    socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
                    socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
                )
                _clients[url] = client
    return client


def signal_relay() -> bool:
    """Push the wake signal now. Returns whether Redis took it."""
    try:
        pipe = redis_client().pipeline(transaction=False)
        pipe.lpush(settings.OUTBOX_WAKE_KEY, 1)
        # One pending signal is as good as a thousand: keep the list from growing
        # while no relay is listening.
        pipe.ltrim(settings.OUTBOX_WAKE_KEY, 0, 0)
        pipe.execute()
    except (redis.RedisError, OSError) as exc:
        logger.warning("outbox wake signal not sent (the relay's sweep will pick it up): %s", exc)
        return False
    return True


def signal_relay_on_commit(using: str | None = None) -> None:
    """Schedule one wake signal for when the current transaction commits (never before)."""
    connection = transaction.get_connection(using)
    if any(entry[1] is signal_relay for entry in connection.run_on_commit):
        return
    transaction.on_commit(signal_relay, using=using)
