"""Log records that carry the ids of the work they were written for.

``ContextFilter`` (installed on the root handler by ``hubdommed.settings.LOGGING``) copies
the correlation id and the ids bound with ``common.context.log_context`` onto every record,
and the current span's ``trace_id`` and ``span_id`` while tracing is on (``common.tracing``).
In production (``LOG_FORMAT=json``) each record is one JSON object per line
(python-json-logger); in development, a readable line with the ids at its end. With JSON,
an exception nothing caught is one record too (``log_uncaught_exceptions``), not a
traceback printed line by line. ``StderrHandler`` writes the lines of a busy process
together, a few times a second, and a quiet process's as they come.
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import os
import sys
import threading
import time
import weakref
from typing import Any

from pythonjsonlogger import json as jsonlogger

from common.context import LOG_IDS, current_correlation_id, current_log_ids
from common.tracing import current_ids

_FIELDS = ("correlation_id", *LOG_IDS, "trace_id", "span_id")


class ContextFilter(logging.Filter):
    """Adds ``correlation_id``, ``run_id``, ``job_id``, ``tenant_id``, ``trace_id`` and
    ``span_id`` to each record.

    An id already on the record (passed with ``extra=``) wins; an unknown one is ``None``,
    which the JSON formatter leaves out.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        ids = current_log_ids()
        if getattr(record, "correlation_id", None) is None:
            record.correlation_id = current_correlation_id()
        for name in LOG_IDS:
            if getattr(record, name, None) is None:
                setattr(record, name, ids.get(name))
        if getattr(record, "trace_id", None) is None:
            span = current_ids()
            record.trace_id, record.span_id = span if span is not None else (None, None)
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger message [correlation_id=… job_id=…]`` for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        ids = " ".join(
            f"{name}={value}" for name in _FIELDS if (value := getattr(record, name, None))
        )
        return f"{line} [{ids}]" if ids else line


class JsonFormatter(jsonlogger.JsonFormatter):
    """One JSON object per record; ids that are not known are left out, not ``null``."""

    def process_log_record(self, log_record: dict) -> dict:
        return {key: value for key, value in log_record.items() if value is not None}


def log_uncaught_exceptions(config: dict[str, Any]) -> None:
    """Log an exception that ends the process (or one of its threads) as one record, its
    traceback inside, through the handlers ``config`` (``settings.LOGGING``) sets up.

    Ctrl-C keeps Python's own handling.
    """
    uncaught = logging.getLogger("hubdommed.uncaught")

    def ready() -> None:
        # An exception raised before Django configured logging still gets the format.
        if not logging.getLogger().handlers:
            logging.config.dictConfig(config)

    def process_hook(kind, value, traceback) -> None:
        if issubclass(kind, KeyboardInterrupt):
            sys.__excepthook__(kind, value, traceback)
            return
        ready()
        uncaught.critical(
            "uncaught %s: %s", kind.__name__, value, exc_info=(kind, value, traceback)
        )

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        if args.exc_type is SystemExit:
            return
        ready()
        name = args.thread.name if args.thread is not None else "?"
        uncaught.critical(
            "uncaught %s in thread %s: %s",
            args.exc_type.__name__,
            name,
            args.exc_value,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )

    sys.excepthook = process_hook
    threading.excepthook = thread_hook


class StderrHandler(logging.StreamHandler):
    """Each record a line on stderr. A line is written at once when the last write is
    ``flush_seconds`` old or more (``LOG_FLUSH_SECONDS``), and so is a warning or worse,
    after the lines before it; the lines that follow a write closer than that wait in a
    buffer, written together ``flush_seconds`` after it. The buffer is also written before
    a fork and at exit.

    A quiet process therefore writes each line as it comes; a busy one, ten times a second
    at most. A line flushed on its own is a system call, and the thread that makes it lets
    go of the interpreter lock, then waits for it behind the process's other threads. In a
    worker running thousands of short tasks a second, one line each, that wait and the
    switches it causes cost more than the tasks themselves (docs/PERFORMANCE.md, "The
    per-task log line at the default level").

    What a ``SIGKILL`` or a crash of the interpreter itself takes with it is the lines
    below warnings of its last ``flush_seconds``; an exception nothing caught is logged as
    a critical record (``log_uncaught_exceptions``), written at once. ``flush_seconds=0``
    writes every line at once, as ``logging.StreamHandler`` does; so does a stderr that is
    not a file descriptor (a test's capture, say).
    """

    def __init__(self, flush_seconds: float = 0.1) -> None:
        try:
            fd = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            fd = None
        if fd is None or flush_seconds <= 0:
            super().__init__(sys.stderr)
            self.flush_seconds = 0.0
            return
        super().__init__(
            open(  # noqa: SIM115 (the handler's for the process's life; closed with it)
                fd,
                "w",
                buffering=1 << 16,
                encoding="utf-8",
                errors="backslashreplace",
                closefd=False,
            )
        )
        self.flush_seconds = flush_seconds
        self._flushed_at = -flush_seconds
        self._waiting = threading.Event()
        # The process the flushing thread runs in: a forked child starts its own.
        self._flusher_pid: int | None = None
        _guard_forks(self)

    def flush(self) -> None:
        super().flush()
        if self.flush_seconds:
            self._flushed_at = time.monotonic()

    def emit(self, record: logging.LogRecord) -> None:
        if not self.flush_seconds:
            super().emit(record)
            return
        try:
            self.stream.write(self.format(record) + self.terminator)
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)
            return
        if (
            record.levelno >= logging.WARNING
            or time.monotonic() - self._flushed_at >= self.flush_seconds
        ):
            self.flush()
            return
        if self._flusher_pid != os.getpid():
            # The first line to wait in this process (a forked child has no flushing thread).
            self._flusher_pid = os.getpid()
            self._waiting = threading.Event()
            threading.Thread(target=self._flush_later, name="log-flush", daemon=True).start()
        # Checked after the write: a flush that starts after this event's clear writes it.
        if not self._waiting.is_set():
            self._waiting.set()

    def _flush_later(self) -> None:
        while True:
            self._waiting.wait()
            time.sleep(max(0.0, self._flushed_at + self.flush_seconds - time.monotonic()))
            self._waiting.clear()
            # Stderr closed or gone: there is nowhere to write, and nobody to tell.
            with contextlib.suppress(OSError, ValueError):
                self.flush()


def flush_now(timeout: float = 1.0) -> None:
    """Write what the root's handlers hold, before a process leaves without its teardown
    (``os._exit``); a handler whose lock is not free within ``timeout`` (a thread stuck
    writing to a full pipe) is skipped rather than waited for."""
    for handler in logging.getLogger().handlers:
        if handler.lock is None or not handler.lock.acquire(timeout=timeout):
            continue
        try:
            with contextlib.suppress(OSError, ValueError):
                handler.flush()
        finally:
            handler.lock.release()


def _guard_forks(handler: StderrHandler) -> None:
    """A fork neither copies the lines that wait (the child would write them too) nor
    happens in the middle of a write: the buffer is written, then the handler's lock held
    until the fork is done (a thread writing at that moment would leave the stream's own
    lock taken in the child, for ever). The child gets a new lock from ``logging``."""
    ref = weakref.ref(handler)
    held = threading.local()

    def before() -> None:
        held.lock = None
        alive = ref()
        # Bounded: a thread that holds the lock and waits for the fork's own locks
        # (``logging.config`` at that very moment) must not stop the fork for good. Long
        # enough that threads writing without a pause on a loaded machine, which take the
        # lock back as soon as they let go of it, do not make the fork go ahead without it.
        if alive is not None and alive.lock is not None and alive.lock.acquire(timeout=10.0):
            held.lock = alive.lock
            alive.stream.flush()
            alive._flushed_at = time.monotonic()

    def after_in_parent() -> None:
        if getattr(held, "lock", None) is not None:
            held.lock.release()
            held.lock = None

    os.register_at_fork(before=before, after_in_parent=after_in_parent)
