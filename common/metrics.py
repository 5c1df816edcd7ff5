"""Prometheus metrics: where they are exposed, and the daemons' heartbeat.

Each app declares its own metrics in its ``metrics.py`` with prometheus-client, under the
``hubdommed_`` prefix, following Prometheus conventions: units in the name (``_seconds``,
``_bytes``), ``_total`` on counters, and labels of low cardinality only (a task name, a
status, a table; never a job, run or tenant id).

The API exposes them at ``/metrics``; under gunicorn's several worker processes, set
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory per service, cleared at start) so that
each process writes its values there and ``/metrics`` adds them up. A daemon serves them on
``METRICS_HOST``:``METRICS_PORT`` (loopback by default; port 0: off) with ``serve_metrics``.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from django.conf import settings
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from common import heartbeats
from lifecycle import conditions

logger = logging.getLogger(__name__)

DAEMON_HEARTBEAT = Gauge(
    "hubdommed_daemon_heartbeat_timestamp_seconds",
    "Unix time of the daemon's last completed loop iteration.",
    ["daemon"],
    multiprocess_mode="max",
)


# The API's requests (common.middleware.RequestMetricsMiddleware). ``route`` is the URL
# pattern that matched (``api/v1/jobs/<int:pk>``), ``unmatched`` for any path that matched
# none: the label's values are bounded by the URL conf, never by what clients send.
HTTP_REQUESTS = Counter(
    "hubdommed_http_requests_total",
    "HTTP requests answered, by route template, method and status code.",
    ["route", "method", "status"],
)
HTTP_REQUEST_DURATION = Histogram(
    "hubdommed_http_request_duration_seconds",
    "Seconds from a request's arrival in Django to its response, by route template and method.",
    ["route", "method"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class _Everything:
    """Exposes another registry whole, so that collectors can be added beside it."""

    def __init__(self, source: CollectorRegistry) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        yield from self._source.collect()


def registry(collectors: Iterable[Collector] = ()) -> CollectorRegistry:
    """The registry to expose: this process's, or every process's of a multiprocess dir.

    ``collectors`` are added for this exposition only: collectors that measure something
    at scrape time (the outbox backlog) in the one process that should report it.
    """
    collectors = list(collectors)
    if multiprocess_dir() is None and not collectors:
        return REGISTRY
    # No auto-describe: a collector that queries the database is only run when scraped.
    exposed = CollectorRegistry(auto_describe=False)
    if multiprocess_dir() is None:
        exposed.register(_Everything(REGISTRY))
    else:
        multiprocess.MultiProcessCollector(exposed)
    for collector in collectors:
        exposed.register(collector)
    return exposed


def exposition(collectors: Iterable[Collector] = ()) -> tuple[bytes, str]:
    """The metrics in the text exposition format, and its content type."""
    return generate_latest(registry(collectors)), CONTENT_TYPE_LATEST


def serve_metrics(
    daemon: str,
    *,
    port: int | None = None,
    addr: str | None = None,
    collectors: Iterable[Collector] = (),
) -> WSGIServer | None:
    """Serve ``/metrics`` in a background thread, and say where in the log; the server.

    ``port`` and ``addr`` default to the ``METRICS_PORT`` and ``METRICS_HOST`` settings.
    ``None`` when the port is 0 (off) or cannot be bound: a port in use is one error line and
    the daemon carries on without its metrics, since the work it does (relaying the outbox,
    running tasks, firing schedules) matters more than the figures about it; an exit would
    take the daemon down with its metrics, under `make run` the whole system with it.
    """
    port = settings.METRICS_PORT if port is None else port
    addr = settings.METRICS_HOST if addr is None else addr
    if not port:
        logger.info("%s metrics off (METRICS_PORT is 0)", daemon)
        return None
    try:
        server, _thread = start_http_server(port, addr=addr, registry=registry(collectors))
    except OSError as exc:
        logger.error(
            "%s metrics not served: cannot listen on %s:%d (%s); carrying on without them",
            daemon,
            addr,
            port,
            exc.strerror or exc,
        )
        return None
    host = f"[{addr}]" if ":" in addr else addr
    logger.info("%s metrics on http://%s:%d/metrics", daemon, host, port)
    return server


class Heartbeat:
    """A daemon's sign of life: a gauge, and a file rewritten for container health checks.

    Call ``beat()`` at the end of each loop iteration (cheap: the file is written at most
    once a second). The health check of a daemon's container compares the file's age with
    the longest a healthy iteration can take; the file holds what degrades the daemon
    meanwhile (JSON: ``status`` ok or degraded, ``degraded`` by name, with its detail and
    since when).
    """

    def __init__(self, daemon: str, liveness_file: str | None = None) -> None:
        self._gauge = DAEMON_HEARTBEAT.labels(daemon=daemon)
        self._path = Path(liveness_file) if liveness_file else None
        self._touched = 0.0
        self._daemon = daemon
        self._recorded = 0.0

    def beat(self) -> None:
        now = time.time()
        self._gauge.set(now)
        if self._path is not None and now - self._touched >= 1.0:
            self._write(now)
            self._touched = now
        if now - self._recorded >= heartbeats.RECORD_EVERY:
            # For the admin's console, which cannot see this process's gauge.
            self._recorded = now
            heartbeats.heartbeat_record(self._daemon, now)

    def _write(self, now: float) -> None:
        """The file's age is the sign of life; its content says what holds the daemon back
        (``lifecycle.conditions``), for whoever reads the health check's output."""
        found = conditions.current()
        state = {
            "daemon": self._daemon,
            "pid": os.getpid(),
            "at": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
            "status": "degraded" if found else "ok",
            "degraded": found,
        }
        self._path.parent.mkdir(parents=True, exist_ok=True)
        # Whole or not at all: the check never reads half a file.
        partial = self._path.with_name(f".{self._path.name}.{os.getpid()}")
        partial.write_text(json.dumps(state) + "\n")
        os.replace(partial, self._path)
