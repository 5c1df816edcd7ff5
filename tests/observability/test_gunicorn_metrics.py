"""The API under gunicorn with several worker processes: ``/metrics`` adds up all of them.

Real gunicorn, started as ``make run`` and the image start it (``gunicorn.conf.py``), with
two workers: each request is served by one of them, each writes its own values under
``PROMETHEUS_MULTIPROC_DIR``, and a scrape, whichever worker answers it, sees the sum.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from tests.observability.conftest import samples
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
SERVED = (
    "hubdommed_http_requests_total",
    frozenset({"route": "health/live", "method": "GET", "status": "200"}.items()),
)


@pytest.fixture
def gunicorn(settings, tmp_path):
    metrics_dir = tmp_path / "metrics"
    metrics_dir.mkdir()
    # Left by a previous run: must not be added in.
    (metrics_dir / "counter_999999.db").write_bytes(b"stale values of another run")
    port = free_port()
    log = open(tmp_path / "gunicorn.log", "ab")  # noqa: SIM115 (the child writes it)
    process = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", "gunicorn.conf.py", "hubdommed.wsgi:application"],
        cwd=ROOT,
        env=process_environment(
            settings,
            HOST="127.0.0.1",
            PORT=str(port),
            WEB_CONCURRENCY="2",
            PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        # Bound at once, but its workers may take a while to boot on a busy machine. Not
        # /health/live, which the tests count: a poll that timed out is still served later.
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            return requests.get(f"{url}/metrics", timeout=5).status_code == 200
        return False

    try:
        wait_until(up, timeout=60, message=lambda: (tmp_path / "gunicorn.log").read_text())
        yield url, metrics_dir, process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def served_by_each_process(metrics_dir: Path, scratch: Path) -> dict[int, float]:
    """Requests to /health/live each worker process counted, read from its own file."""
    counts = {}
    for path in metrics_dir.glob("counter_*.db"):
        alone = scratch / path.stem
        shutil.rmtree(alone, ignore_errors=True)
        alone.mkdir(parents=True)
        shutil.copy(path, alone)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=str(alone))
        value = registry.get_sample_value(SERVED[0], dict(SERVED[1]))
        if value:
            counts[int(path.stem.split("_")[1])] = value
    return counts


def test_metrics_of_every_worker_process_are_added_up(gunicorn, tmp_path):
    url, metrics_dir, _master = gunicorn
    assert not (metrics_dir / "counter_999999.db").exists()  # emptied at start
    sent = 0

    def both_workers_served() -> bool:
        nonlocal sent
        # A new connection per request (no session): any worker may take it.
        for _ in range(10):
            assert requests.get(f"{url}/health/live", timeout=30).status_code == 200
            sent += 1
        return len(served_by_each_process(metrics_dir, tmp_path / "scratch")) >= 2

    wait_until(both_workers_served, timeout=60, interval=0)

    per_process = served_by_each_process(metrics_dir, tmp_path / "scratch")
    assert len(per_process) == 2 and all(count > 0 for count in per_process.values())
    assert sum(per_process.values()) == sent
    # Whichever worker answers the scrape, it reports the sum of both.
    for _ in range(4):
        exposed = samples(requests.get(f"{url}/metrics", timeout=30).text)
        assert exposed[SERVED] == sent


def test_a_replaced_worker_s_counts_are_kept(gunicorn, tmp_path):
    url, metrics_dir, _master = gunicorn
    for _ in range(5):
        requests.get(f"{url}/health/live", timeout=30)
    sent = 5
    wait_until(lambda: sum(served_by_each_process(metrics_dir, tmp_path / "s").values()) == sent)
    victim = next(iter(served_by_each_process(metrics_dir, tmp_path / "s")))

    os.kill(victim, signal.SIGKILL)  # gunicorn starts another in its place

    def served_again() -> bool:
        nonlocal sent
        with contextlib.suppress(requests.ConnectionError):  # the victim's last accept
            ok = requests.get(f"{url}/health/live", timeout=30).status_code == 200
            sent += ok
            return ok
        return False

    wait_until(served_again, timeout=30)
    exposed = samples(requests.get(f"{url}/metrics", timeout=30).text)
    # The counter never goes backwards: the dead worker's requests still count.
    assert exposed[SERVED] == sent
