"""The wake signal: after commit, tell the relay there is something to send.

Only an accelerator. A lost signal loses nothing (the relay also sweeps), so
Redis being slow or down is logged and never fails the caller; after a failure the process
skips Redis for a while (``common.accelerator``), so a hung Redis does not cost every
commit its timeout.

The same signal on a key of its own wakes another daemon that sleeps until a change
(the scheduler, when a schedule's next due time moved): ``signal_key`` and
``signal_key_on_commit`` push it, ``wait_for_signal`` waits for it. ``announce`` publishes
on a channel instead, for every process that subscribes (a job's live followers).
"""

from __future__ import annotations

import logging
import threading
from functools import partial

import redis
from django.conf import settings
from django.db import transaction

from common.accelerator import redis_hold_off

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


def _push(key: str) -> None:
    """Push one pending signal on ``key``. Raises what redis-py raises."""
    pipe = redis_client().pipeline(transaction=False)
    pipe.lpush(key, 1)
    # One pending signal is as good as a thousand: keep the list from growing while nobody
    # is listening.
    pipe.ltrim(key, 0, 0)
    pipe.execute()


def _signal(key: str, what: str, fallback: str, *, send=_push) -> bool:
    """Push the signal on ``key`` unless Redis is held off; returns whether Redis took it.
    A failure is logged once per outage (``fallback``: what makes up for the lost signal)."""
    hold_off = redis_hold_off()
    if not hold_off.admits():
        return False
    try:
        send(key)
    except (redis.RedisError, OSError) as exc:
        if hold_off.failed():
            logger.warning(
                "%s not sent (%s); Redis skipped until it answers again (asked every %g s): %s",
                what,
                fallback,
                settings.REDIS_HOLD_OFF_SECONDS,
                exc,
            )
        return False
    return True


def signal_relay() -> bool:
    """Push the wake signal now. Returns whether Redis took it."""
    return _signal(
        settings.OUTBOX_WAKE_KEY, "outbox wake signal", "the relay's sweep will pick it up"
    )


def signal_relay_on_commit(using: str | None = None) -> None:
    """Schedule one wake signal for when the current transaction commits (never before)."""
    connection = transaction.get_connection(using)
    if any(entry[1] is signal_relay for entry in connection.run_on_commit):
        return
    transaction.on_commit(signal_relay, using=using)


def signal_key(key: str) -> bool:
    """Push the wake signal on ``key`` now (one pending at most). Returns whether Redis
    took it; a Redis away is logged: whoever waits on ``key`` also sweeps."""
    return _signal(key, f"wake signal {key}", "its sweep will pick the change up")


def signal_key_on_commit(key: str, using: str | None = None) -> None:
    """One wake signal on ``key`` when the current transaction commits (never before)."""
    _once_on_commit(signal_key, key, using=using)


def announce(channel: str, message: str) -> bool:
    """Publish ``message`` on ``channel`` now, for whoever subscribes at this moment (no one
    may: a subscriber also reads on its own). Returns whether Redis took it."""
    return _signal(
        channel,
        f"announcement on {channel}",
        "its subscribers read again on their own",
        send=lambda key: redis_client().publish(key, message),
    )


def announce_on_commit(channel: str, message: str, using: str | None = None) -> None:
    """One ``announce`` when the current transaction commits (never before)."""
    _once_on_commit(announce, channel, message, using=using)


def _once_on_commit(func, *args: str, using: str | None) -> None:
    """``func(*args)`` when the current transaction commits, once however often asked."""
    connection = transaction.get_connection(using)
    for entry in connection.run_on_commit:
        callback = entry[1]
        if isinstance(callback, partial) and callback.func is func and callback.args == args:
            return
    transaction.on_commit(partial(func, *args), using=using)


def wait_for_signal(client: redis.Redis, key: str, timeout: float) -> bool:
    """Block up to ``timeout`` seconds for a signal on ``key``; True when one came.
    ``client`` must allow a read that long (``redis_client``'s timeouts are short). Raises
    ``redis.RedisError`` or ``OSError`` when Redis is away: the caller sleeps instead."""
    if timeout <= 0:
        return False
    # BLPOP takes fractions of a second; 0 would mean forever.
    return client.blpop([key], timeout=max(timeout, 0.01)) is not None
