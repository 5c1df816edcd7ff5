"""How every daemon stops and how it waits for what is away: one of each, no copies.

- ``Stop``: a flag that SIGTERM and SIGINT set, and waits that wake on it within a slice;
- ``Backoff``: the pauses between attempts at something unreachable (a broker, the
  database, the hub), doubling from ``first`` up to ``cap``.

Plain Python, no Django: the consume loop (``broker``), the relay, the worker, the
stuck-job monitor and an automation's worker all use it. Beside it, ``lifecycle.startup``
(a stop asked for before a daemon's own handlers are in place) and ``lifecycle.daemon``
(the skeleton of a polling daemon, a Django command).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator

# Longest single wait on the flag: a signal handler runs between two slices at the latest.
WAIT_SLICE = 1.0


class Stop:
    """A daemon's stop flag. ``set`` is safe in a signal handler: it only sets flags (the
    callbacks given to ``on_stop`` must do no more); the loops do the rest."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._callbacks: list[Callable[[], None]] = []

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def on_stop(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` (once) when the stop is asked for."""
        self._callbacks.append(callback)

    def set(self) -> None:
        first = not self._event.is_set()
        self._event.set()
        if first:
            for callback in self._callbacks:
                callback()

    def wait(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` seconds (None: until the stop); True when stopping."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self._event.is_set():
            remaining = WAIT_SLICE if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                break
            self._event.wait(min(remaining, WAIT_SLICE))
        return self._event.is_set()

    def sleep_until(self, deadline: float) -> bool:
        """Wait until the monotonic ``deadline``; True when stopping."""
        return self.wait(max(0.0, deadline - time.monotonic()))

    def install(
        self,
        signals: Iterable[signal.Signals] = (signal.SIGTERM, signal.SIGINT),
        *,
        twice: Callable[[], None] | None = None,
    ) -> None:
        """Let these signals set the flag (the main thread only). ``twice``: what a second
        signal does once the stop is under way (by default, nothing more)."""

        def on_signal(signum, frame) -> None:
            if self.requested and twice is not None:
                twice()
                return
            self.set()

        for signum in signals:
            signal.signal(signum, on_signal)

    @contextlib.contextmanager
    def bounded(self, seconds: float, say: Callable[[str], None], code: int = 1) -> Iterator[None]:
        """Within the block, a stop is over ``seconds`` after it was asked for, whatever
        the process is blocked on (a database or broker that hung mid-answer, a call that
        ignores the flag): past them ``say`` is told where the main thread is, and the
        process ends there (``os._exit(code)``). What it did not finish comes back as after
        a crash (leases, the broker's requeue): better than a stop that never ends, or one
        an orchestrator's kill ends in silence."""
        finished = threading.Event()
        main = threading.main_thread()

        def watch() -> None:
            self._event.wait()
            if finished.wait(seconds):
                return
            frame = sys._current_frames().get(main.ident or 0)
            stack = traceback.extract_stack(frame)[-3:] if frame is not None else []
            where = " < ".join(
                f"{step.name} ({step.filename}:{step.lineno})" for step in stack[::-1]
            )
            say(f"still running {seconds:g} s after the stop, in {where or '?'}: leaving now")
            os._exit(code)

        threading.Thread(target=watch, name="stop-deadline", daemon=True).start()
        try:
            yield
        finally:
            finished.set()


class Backoff:
    """Pauses between attempts: ``first`` after the first failure, doubling up to ``cap``.
    With ``jitter`` each pause is drawn between half and all of that, so that many
    clients coming back together do not retry in step."""

    def __init__(self, first: float = 0.5, cap: float = 30.0, *, jitter: bool = False) -> None:
        self.first = first
        self.cap = cap
        self.jitter = jitter
        # Consecutive failures so far (0: the last attempt worked).
        self.failures = 0

    @property
    def pause(self) -> float:
        """The pause (its ceiling, with jitter) after the failures counted so far."""
        if not self.failures:
            return 0.0
        return min(self.cap, self.first * 2 ** min(self.failures - 1, 30))

    def failed(self) -> float:
        """Count one failure; the pause to take before the next attempt."""
        self.failures += 1
        ceiling = self.pause
        return random.uniform(ceiling / 2, ceiling) if self.jitter else ceiling

    def reset(self) -> None:
        self.failures = 0
