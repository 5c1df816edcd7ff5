"""Log records that carry the ids of the work they were written for.

``ContextFilter`` (installed on the root handler by ``hubdommed.settings.LOGGING``) copies
the correlation id and the ids bound with ``common.context.log_context`` onto every record,
and the current span's ``trace_id`` and ``span_id`` while tracing is on (``common.tracing``).
In production (``LOG_FORMAT=json``) each record is one JSON object per line
(python-json-logger); in development, a readable line with the ids at its end. With JSON,
an exception nothing caught is one record too (``log_uncaught_exceptions``), not a
traceback printed line by line.
"""

from __future__ import annotations

import logging
import logging.config
import sys
import threading
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
