"""Gunicorn's settings for the API (``gunicorn -c gunicorn.conf.py hubdommed.wsgi``).

Prometheus metrics in multiprocess mode (prometheus-client's recipe): each worker process
writes its values under ``PROMETHEUS_MULTIPROC_DIR`` and ``/metrics`` adds up every
process's files, so a scrape sees the whole API whichever worker answers it.

- The directory must be known before any worker imports prometheus-client (it picks its
  storage at import): it is set here, in the master, and the workers inherit it. Without
  one in the environment, a new temporary directory is made per start.
- It is emptied when the master starts: values of a previous run would be added in.
- A worker that exits has its live gauges removed (``mark_process_dead``); its counters
  stay, so totals never go backwards when gunicorn replaces a worker.

The answers gunicorn gives itself, before Django sees a request (a request line longer than
``limit_request_line``: 414; headers past ``limit_request_field_size`` or
``limit_request_fields``: 431; a request it cannot parse: 400), are JSON in the API's one
error format (``common.api.error_body``) instead of gunicorn's HTML page: a client of
``/api/`` reads every error the same way. The path is not known yet at that point (the
request line itself may be what was refused), so these answers are JSON everywhere.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

from gunicorn import util

if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="hubdommed-metrics-")

# The settings' logging (LOG_FORMAT, LOG_LEVEL, the ids filter) for gunicorn's own lines
# too: with LOG_FORMAT=json, its start-up lines, its warnings and a worker's traceback are
# JSON records like the application's. Reading the settings here also stops a bad variable
# in the master, with the message naming it, before any worker boots.
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
from django.conf import settings as _settings

from common.env import settings_or_exit
from lifecycle.values import parse_number

settings_or_exit()

logconfig_dict = {
    **_settings.LOGGING,
    "loggers": {
        **_settings.LOGGING["loggers"],
        "gunicorn.error": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        # Off (warnings only, and it writes none): the application logs each request itself,
        # with its ids. At INFO its lines would be formatted like every other line.
        "gunicorn.access": {"handlers": ["stderr"], "level": "WARNING", "propagate": False},
    },
}

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"


def _web_concurrency() -> int:
    """Worker processes: 0 would be a master that listens and never answers."""
    raw = os.environ.get("WEB_CONCURRENCY", "2")
    try:
        return int(parse_number(raw, whole=True, minimum=1, maximum=1000))
    except ValueError as exc:
        sys.stderr.write(f"cannot start: WEB_CONCURRENCY={raw!r} is not {exc}\n")
        raise SystemExit(1) from None


workers = _web_concurrency()
# Each request is logged by the application itself (method, route, status, duration,
# with its correlation id): no access log of gunicorn's beside it (see logconfig_dict).
accesslog = None
loglevel = "info"


# What gunicorn refuses itself, in the API's words: a stable code and a human message.
_REFUSALS = {
    400: ("malformed_request", "The request could not be read as HTTP."),
    403: ("forbidden", "The request is forbidden."),
    414: ("uri_too_long", "The request line (method, path and query) is too long."),
    417: ("expectation_failed", "The request's Expect header cannot be met."),
    431: ("headers_too_large", "The request's headers are too large or too many."),
    500: ("internal_error", "The server failed to answer the request."),
    501: ("not_implemented", "The request's transfer coding is not supported."),
}


def write_json_error(sock, status_int: int, reason: str, mesg: str) -> None:
    """``gunicorn.util.write_error`` in the API's one error format. Gunicorn's own message
    is left out: it quotes what the client sent (a whole header line, say)."""
    code, message = _REFUSALS.get(status_int, ("malformed_request", reason))
    body = json.dumps({"error": {"code": code, "message": message, "details": {}}}).encode()
    head = (
        f"HTTP/1.1 {status_int} {reason}\r\n"
        "Connection: close\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    util.write_nonblock(sock, head.encode("latin-1") + body)


# The workers are forked from this process and call it through the module, at each error.
util.write_error = write_json_error


def on_starting(server) -> None:
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
