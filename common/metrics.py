"""Prometheus metrics: where they are exposed, and the daemons' heartbeat.

Each app declares its own metrics in its ``metrics.py`` with prometheus-client, under the
``hubdommed_`` prefix, following Prometheus conventions: units in the name (``_seconds``,
``_bytes``), ``_total`` on counters, and labels of low cardinality only (a task name, a
status, a table; never a job, run or tenant id).

The API exposes them at ``/metrics``; under gunicorn's several worker processes, set
``PROMETHEUS_MULTIPROC_DIR`` (an empty directory per service, cleared at start) so that
each process writes its values there and ``/metrics`` adds them up. A daemon serves them on
``METRICS_PORT`` (0: off) with ``serve_metrics``.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Gauge,
    generate_latest,
    multiprocess,
    start_http_server,
)

DAEMON_HEARTBEAT = Gauge(
    "hubdommed_daemon_heartbeat_timestamp_seconds",
    "Unix time of the daemon's last completed loop iteration.",
    ["daemon"],
    multiprocess_mode="max",
)


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


def registry() -> CollectorRegistry:
    """The registry to expose: this process's, or every process's of a multiprocess dir."""
    if multiprocess_dir() is None:
        return REGISTRY
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)
    return collected


def exposition() -> tuple[bytes, str]:
    """The metrics in the text exposition format, and its content type."""
    return generate_latest(registry()), CONTENT_TYPE_LATEST


def serve_metrics(port: int, addr: str = "0.0.0.0") -> threading.Thread | None:  # noqa: S104
    """Serve ``/metrics`` on ``port`` in a background thread (``None`` when port is 0)."""
    if not port:
        return None
    _server, thread = start_http_server(port, addr=addr, registry=registry())
    return thread


class Heartbeat:
    """A daemon's sign of life: a gauge, and a file touched for container health checks.

    Call ``beat()`` at the end of each loop iteration (cheap: the file is touched at most
    once a second). The health check of a daemon's container compares the file's age with
    the longest a healthy iteration can take.
    """

    def __init__(self, daemon: str, liveness_file: str | None = None) -> None:
        self._gauge = DAEMON_HEARTBEAT.labels(daemon=daemon)
        self._path = Path(liveness_file) if liveness_file else None
        self._touched = 0.0

    def beat(self) -> None:
        now = time.time()
        self._gauge.set(now)
        if self._path is not None and now - self._touched >= 1.0:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._path.touch()
            self._touched = now
