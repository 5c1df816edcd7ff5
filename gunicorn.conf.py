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
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="hubdommed-metrics-")

bind = f"{os.environ.get('HOST', '127.0.0.1')}:{os.environ.get('PORT', '8000')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
# Each request is logged by the application itself (method, route, status, duration,
# with its correlation id): no access log of gunicorn's beside it.
accesslog = None
loglevel = "info"


def on_starting(server) -> None:
    directory = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def child_exit(server, worker) -> None:
    from prometheus_client import multiprocess

    multiprocess.mark_process_dead(worker.pid)
