"""Redis is an accelerator: when it stops answering, this process stops asking until it does.

A Redis that refuses connections costs a call nothing. One that hangs (a frozen server, a
partition that drops packets) costs every call its whole socket timeout: every API write
waiting half a second for a wake signal that the relay's sweep makes up for anyway. So the
first failed call holds Redis off: from then on the callers skip it at once, as if it were
down, and a thread of the process's own asks Redis every ``REDIS_HOLD_OFF_SECONDS`` whether
it answers again; its first answer ends the hold-off.

A Redis that hangs costs each process one timeout per outage, in one request, whatever the
outage's length; the callers never wait for the probe.
"""

from __future__ import annotations

import logging
import os
import threading

import redis
from django.conf import settings

from lifecycle import conditions

logger = logging.getLogger("hubdommed")


class HoldOff:
    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._failed = False
        self._prober: threading.Thread | None = None
        self._ended = threading.Event()

    def admits(self) -> bool:
        """Whether to call Redis now."""
        return not self._failed

    def failed(self) -> bool:
        """Hold Redis off from now; True when it was not held off already (worth a log line)."""
        with self._lock:
            first = not self._failed
            self._failed = True
            conditions.degraded(
                "redis",
                f"not answering: skipped, asked every {settings.REDIS_HOLD_OFF_SECONDS:g} s",
                replace=False,
            )
            if self._prober is None and not self._ended.is_set():
                self._prober = threading.Thread(
                    target=self._probe, name="redis-hold-off", daemon=True
                )
                self._prober.start()
        return first

    def end(self) -> None:
        """Stop probing and let every caller through again."""
        self._ended.set()
        with self._lock:
            self._failed = False
        conditions.recovered("redis")

    def _probe(self) -> None:
        client = redis.Redis.from_url(
            self.url,
            socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
        )
        try:
            while not self._ended.wait(settings.REDIS_HOLD_OFF_SECONDS):
                try:
                    client.ping()
                except (redis.RedisError, OSError):
                    continue
                with self._lock:
                    self._failed = False
                    self._prober = None
                conditions.recovered("redis")
                logger.info("Redis answers again: its callers use it again")
                return
        finally:
            client.close()


_hold_offs: dict[str, HoldOff] = {}
_hold_offs_lock = threading.Lock()


def redis_hold_off(url: str | None = None) -> HoldOff:
    """The process's one view of the Redis at ``url`` (``REDIS_URL`` by default): the wake
    signals, the login throttles and the heartbeats' records share it."""
    url = url or settings.REDIS_URL
    hold_off = _hold_offs.get(url)
    if hold_off is None:
        with _hold_offs_lock:
            hold_off = _hold_offs.setdefault(url, HoldOff(url))
    return hold_off


def forget() -> None:
    """End every hold-off (tests; a process that wants to try Redis at once)."""
    with _hold_offs_lock:
        hold_offs = list(_hold_offs.values())
        _hold_offs.clear()
    for hold_off in hold_offs:
        hold_off.end()


def _after_fork_in_child() -> None:
    # A forked child (gunicorn's workers, a test's process) inherits the hold-offs but not
    # the threads that probe for their end: it starts with none, and finds out for itself.
    global _hold_offs_lock
    _hold_offs_lock = threading.Lock()
    _hold_offs.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)
