"""``make run``'s metrics: every daemon serves ``/metrics`` on a port of its own, derived from
``PORT`` (honcho gives each Procfile line ``PORT`` + 100 in turn), with no ``METRICS_PORT``
to set; a ``METRICS_PORT`` in the environment (one port for every daemon) no longer makes
them collide, and two systems started side by side with different ``PORT``s do not either.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest
import requests
from django.db import connection

from tests.e2e.conftest import ROOT
from tests.polling import wait_until
from tests.ports import free_port, free_port_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# The Procfile's daemons, in its order: each one's PORT is the web's + 100 times its place.
DAEMONS = {"relay": 100, "worker": 200, "monitor": 300, "scheduler": 400}
# The application's own servers, which serve its /metrics: the API and the live streams.
SERVERS = {"api": 0, "stream": 500}


def base_port(systems: int) -> int:
    """A PORT whose daemons' ports, and the next ``systems - 1`` PORTs' too, are free (and
    in this worker's slice: no other worker takes one while the systems start)."""
    return free_port_with(
        n + offset for n in range(systems) for offset in (*SERVERS.values(), *DAEMONS.values())
    )


class System:
    """``scripts/run.sh`` as ``make run`` starts it, in a process group of its own."""

    def __init__(self, settings, tmp_path: Path, port: int, metrics_port: int) -> None:
        db = connection.settings_dict
        self.port = port
        self.log = tmp_path / f"run-{port}.log"
        self.env = {
            **os.environ,
            "BIN": ".venv/bin",
            "HOST": "127.0.0.1",
            "PORT": str(port),
            # One port for every daemon, as an operator might set it: make run gives each
            # its own anyway.
            "METRICS_PORT": str(metrics_port),
            "DATABASE_URL": (
                f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
            ),
            "BROKER": "rabbitmq",
            "QUEUE_PREFIX": settings.QUEUE_PREFIX,
            "RABBITMQ_EXCHANGE": settings.RABBITMQ_EXCHANGE,
            "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
            "LOCAL_MACHINES_DIR": str(tmp_path / f"machines-{port}"),
            "DEMO_LOGIN_FILE": str(tmp_path / f"demo-login-{port}.txt"),
            "WEB_CONCURRENCY": "1",
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                ["scripts/run.sh"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def metrics(self, port: int) -> str | None:
        # Not there yet, or too busy starting to answer in time: asked again.
        with contextlib.suppress(requests.RequestException):
            response = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
            if response.status_code == 200:
                return response.text
        return None

    def wait_for_every_daemons_metrics(self) -> dict[str, str]:
        answers = {}
        for daemon, offset in {**SERVERS, **DAEMONS}.items():
            answers[daemon] = wait_until(
                lambda offset=offset: (
                    self.process.poll() is None and self.metrics(self.port + offset)
                ),
                timeout=120,
                message=lambda: self.text()[-6000:],
            )
        return answers

    def stop(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.mark.timeout(300)
def test_make_run_serves_every_daemons_metrics_and_two_runs_do_not_collide(
    settings, broker_names, tmp_path
):
    port = base_port(systems=2)
    shared_metrics_port = free_port()
    first = System(settings, tmp_path, port, shared_metrics_port)
    second = None
    try:
        answers = first.wait_for_every_daemons_metrics()
        # The API's: it counted the scrape before this one.
        assert 'route="metrics"' in first.metrics(port)
        for daemon in ("relay", "monitor", "scheduler"):
            assert f'hubdommed_daemon_heartbeat_timestamp_seconds{{daemon="{daemon}"}}' in (
                first.metrics(port + DAEMONS[daemon])
            )
        # The relay's port is the relay's: the outbox backlog is reported there alone.
        assert "hubdommed_outbox_pending_messages" in answers["relay"]

        # A second system beside it, one PORT up: ten endpoints, none taken twice.
        second = System(settings, tmp_path, port + 1, shared_metrics_port)
        second.wait_for_every_daemons_metrics()
        first.wait_for_every_daemons_metrics()
    finally:
        first.stop()
        if second is not None:
            second.stop()
    for system in (first, second):
        log = system.text()
        for daemon, offset in DAEMONS.items():
            assert f"{daemon} metrics on http://127.0.0.1:{system.port + offset}/metrics" in log
        assert "metrics not served" not in log
        assert "Address already in use" not in log
        # Where each listens, printed before anything starts.
        assert (
            f"relay http://127.0.0.1:{system.port + 100}/metrics, "
            f"worker http://127.0.0.1:{system.port + 200}/metrics, "
            f"monitor http://127.0.0.1:{system.port + 300}/metrics, "
            f"scheduler http://127.0.0.1:{system.port + 400}/metrics"
        ) in " ".join(log.split())
        assert (
            "Live streams (GET /api/v1/jobs/{id}/output/stream) on "
            f"http://127.0.0.1:{system.port + 500}/" in log
        )
