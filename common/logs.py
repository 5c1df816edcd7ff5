"""Log records that carry the ids of the work they were written for.

``ContextFilter`` (installed on the root handler by ``hubdommed.settings.LOGGING``) copies
the correlation id and the ids bound with ``common.context.log_context`` onto every record,
and the current span's ``trace_id`` and ``span_id`` while tracing is on (``common.tracing``).
In production (``LOG_FORMAT=json``) each record is one JSON object per line
(python-json-logger); in development, a readable line with the ids at its end.
"""

from __future__ import annotations

import logging

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
