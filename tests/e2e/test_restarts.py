"""A job's outcome survives the whole system stopping, and a credential rotation does not
strand the worker: both end to end, with every process real.

The first test runs the system the way ``make run`` does (``scripts/run.sh`` under
honcho: gunicorn, relay, background worker, monitor) on a port, database and broker
names of its own, stops it with SIGTERM to its whole process group while a 20-second job
runs, and starts it again.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests
from django.db import connection
from django.utils import timezone

from job.models import Job
from job.services import job_create
from tests.e2e.conftest import ROOT, job_status
from tests.factories import PlatformAdminFactory
from tests.polling import wait_until
from tests.ports import free_port_with

pytestmark = [pytest.mark.django_db(transaction=True)]


class Stack:
    """``scripts/run.sh`` as ``make run`` starts it, in a process group of its own."""

    def __init__(self, settings, tmp_path: Path) -> None:
        db = connection.settings_dict
        # The API's port and its daemons' (make run's: 100 apart, up to the stream's + 500).
        self.port = free_port_with(range(0, 600, 100))
        self.machines = tmp_path / "machines"
        self.logs = tmp_path
        self.env = {
            **os.environ,
            "BIN": ".venv/bin",
            "HOST": "127.0.0.1",
            "PORT": str(self.port),
            "HUB_URL": f"http://127.0.0.1:{self.port}",
            "DATABASE_URL": (
                f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
            ),
            "BROKER": "rabbitmq",
            "QUEUE_PREFIX": settings.QUEUE_PREFIX,
            "RABBITMQ_EXCHANGE": settings.RABBITMQ_EXCHANGE,
            "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
            "LOCAL_MACHINES_DIR": str(self.machines),
            "DEMO_LOGIN_FILE": str(tmp_path / "demo-login.txt"),
            "WEB_CONCURRENCY": "1",
            "MONITOR_INTERVAL_SECONDS": "1",
            "AGENT_POLL_INTERVAL": "1",
            "AGENT_REPORT_BACKOFF_MAX": "2",
            # Longer than what is left of the job when the stop comes.
            "WORKER_STOP_BUDGET": "25",
            "PYTHONUNBUFFERED": "1",
        }
        self.process: subprocess.Popen | None = None
        self.starts = 0

    def start(self) -> None:
        self.starts += 1
        log = open(self.logs / f"stack-{self.starts}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            ["scripts/run.sh"],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def terminate(self) -> None:
        """SIGTERM to the whole process group, as a terminal's Ctrl-C reaches all of it."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def worker_pid(self, slug: str) -> int | None:
        with contextlib.suppress(FileNotFoundError, ValueError):
            return int((self.machines / f"{slug}.pid").read_text())
        return None

    def cleanup(self) -> None:
        self.terminate()
        for pid_file in self.machines.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    def log_text(self) -> str:
        paths = [*self.logs.glob("stack-*.log"), *self.machines.glob("*.log")]
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-4000:]}" for path in sorted(paths)
        )


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is gone for our purpose.
    with contextlib.suppress(OSError):
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    return True


@pytest.mark.timeout(240)
def test_stopping_the_whole_system_while_a_job_runs_loses_nothing(
    settings, broker_names, catalog, person, tmp_path
):
    automation = catalog("survivor").automation
    stack = Stack(settings, tmp_path)
    try:
        stack.start()
        job, _ = job_create(
            tenant=person.tenant,
            automation_id=automation.id,
            params={"name": "Ada", "sleep": 20},
            requested_by=person,
        )
        wait_until(
            lambda: job_status(job.id) == "running",
            timeout=60,
            message=lambda: f"job is {job_status(job.id)}\n{stack.log_text()}",
        )
        time.sleep(2)

        stack.terminate()  # the whole system stops while the command still runs

        # The stopped worker finishes the command within its stop budget, cannot report
        # (the hub is gone), keeps the outcome on its machine's disk and exits.
        pid = stack.worker_pid("survivor")
        wait_until(lambda: not alive(pid), timeout=60, message=stack.log_text)
        assert job_status(job.id) == "running"
        assert list((stack.machines / "survivor.outcomes").glob("job-*.json"))

        stack.start()

        wait_until(
            lambda: job_status(job.id) not in ("pending", "running"),
            timeout=60,
            message=lambda: f"job is {job_status(job.id)}\n{stack.log_text()}",
        )
        # The worker lets go of the kept outcome once the hub took it, a moment after the
        # job's end is committed: before the stack stops under it.
        wait_until(
            lambda: not list((stack.machines / "survivor.outcomes").glob("job-*.json")),
            timeout=30,
            message=stack.log_text,
        )
    finally:
        stack.cleanup()
    job.refresh_from_db()
    assert job.status == "succeeded", f"{job.failure_reason}: {job.error}\n{stack.log_text()}"
    assert "hello, Ada!" in job.output_tail and "done" in job.output_tail
    assert job.attempt == 1
    assert not list((stack.machines / "survivor.outcomes").glob("job-*.json"))


@pytest.mark.timeout(180)
def test_a_job_runs_within_seconds_of_a_credential_rotation(system, catalog, api):
    created = catalog("rotated")
    automation = created.automation
    system.relay()
    system.background_worker()
    first = api.post(f"{api.base}/jobs", json={"automation": automation.id, "params": {}})
    assert first.status_code == 201, first.text
    wait_until(
        lambda: job_status(first.json()["id"]) == "succeeded",
        timeout=90,
        message=lambda: f"first job: {job_status(first.json()['id'])}\n{system.log_text()}",
    )
    # The worker the first job powered on is idle now, holding its credential.
    admin = requests.Session()
    from identity.tokens import issue_access_token

    admin.headers["Authorization"] = f"Bearer {issue_access_token(PlatformAdminFactory()).token}"
    rotated = admin.post(f"{api.base}/automations/{automation.id}/worker/rotate-credential")
    assert rotated.status_code == 200, rotated.text

    posted = timezone.now()
    second = api.post(
        f"{api.base}/jobs", json={"automation": automation.id, "params": {"name": "again"}}
    )
    assert second.status_code == 201, second.text
    job_id = second.json()["id"]

    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=30,
        message=lambda: f"second job: {job_status(job_id)}\n{system.log_text()}",
    )
    job = Job.objects.get(pk=job_id)
    assert (job.started_at - posted).total_seconds() < 10, system.log_text()
    assert "hello, again!" in job.output_tail
    admin.close()
