"""Redis is an accelerator: when it stops answering, this process stops asking for a while.

A Redis that refuses connections costs a call nothing. One that hangs (a frozen server, a
partition that drops packets) costs every call its whole socket timeout: every API write
waiting half a second for a wake signal that the relay's sweep makes up for anyway. So a
failed call holds Redis off for ``REDIS_HOLD_OFF_SECONDS``; during that time the callers
skip it at once, as if it were down. When the time is up, one caller tries again (the
others keep skipping until that try has answered); a success ends the hold-off.

A Redis that hangs costs each process one timeout per hold-off, not one per request.
"""

from __future__ import annotations

import threading
import time

from django.conf import settings


class HoldOff:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Monotonic time until which callers skip Redis; 0: no hold-off.
        self._until = 0.0
        self._failed = False

    def admits(self) -> bool:
        """Whether to call Redis now. The first caller after a hold-off is the one that
        tries again: the hold-off is extended for the others while its call is out."""
        if not self._failed:
            return True
        with self._lock:
            now = time.monotonic()
            if now < self._until:
                return False
            self._until = now + settings.REDIS_HOLD_OFF_SECONDS
            return True

    def succeeded(self) -> None:
        if self._failed:
            with self._lock:
                self._failed = False
                self._until = 0.0

    def failed(self) -> bool:
        """Hold Redis off from now; True when it was not held off already (worth a log line)."""
        with self._lock:
            first = not self._failed
            self._failed = True
            self._until = time.monotonic() + settings.REDIS_HOLD_OFF_SECONDS
            return first

    @property
    def holding(self) -> bool:
        return self._failed


_hold_offs: dict[str, HoldOff] = {}
_hold_offs_lock = threading.Lock()


def redis_hold_off(url: str | None = None) -> HoldOff:
    """The process's one view of the Redis at ``url`` (``REDIS_URL`` by default): the wake
    signals and the login throttles share it."""
    url = url or settings.REDIS_URL
    hold_off = _hold_offs.get(url)
    if hold_off is None:
        with _hold_offs_lock:
            hold_off = _hold_offs.setdefault(url, HoldOff())
    return hold_off


def forget() -> None:
    """Drop every hold-off (tests; a process that wants to try Redis at once)."""
    with _hold_offs_lock:
        _hold_offs.clear()
