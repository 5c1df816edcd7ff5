"""The whole system for end-to-end tests: the API over HTTP and the daemons as processes.

The API is pytest-django's live server (a real HTTP server on loopback, in this process,
over the test database). The relay, the background worker and the automation workers are
real ``manage.py`` processes sharing that database, this session's Redis prefix and broker
names of their own. Nothing in between is driven by the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pika
import pytest
import requests
from django.conf import settings as django_settings
from django.db import DatabaseError, connection

from automation.models import Automation
from automation.services import automation_create
from broker import topology
from broker.topology import QUEUES
from identity.tokens import issue_access_token
from job.models import Job
from sector.services import sector_create
from tests.factories import PlatformAdminFactory, UserFactory

ROOT = Path(__file__).resolve().parents[2]
DEMO = [sys.executable, str(ROOT / "scripts" / "demo_automation.py")]


def ticking(lines: int) -> list[str]:
    """A command that prints ``lines`` lines, one every 100 ms, each with when it printed
    it: ``tick <n> <time>``."""
    program = (
        "import sys, time\n"
        "for n in range(int(sys.argv[1])):\n"
        "    print(f'tick {n} {time.time()}', flush=True)\n"
        "    time.sleep(0.1)\n"
    )
    return [sys.executable, "-c", program, str(lines)]


@pytest.fixture
def broker_names(settings):
    settings.QUEUE_PREFIX = f"e2e-{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = f"dom_med_e2e_{uuid.uuid4().hex[:6]}"
    created_automations: list[int] = []
    yield created_automations
    # Every automation of the test's database has its queue too (`make run` seeds the demo
    # automation): the database is still there, as this fixture was set up after it.
    with contextlib.suppress(DatabaseError):
        created_automations.extend(Automation.objects.values_list("id", flat=True))
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        destinations = [*QUEUES, *(f"automation-{i}" for i in set(created_automations))]
        for destination in destinations:
            channel.queue_delete(topology.queue_name(destination))
            channel.queue_delete(topology.dead_letter_queue_name(destination))
        channel.exchange_delete(settings.RABBITMQ_EXCHANGE)
    finally:
        conn.close()


class System:
    """Starts the daemons against the live server and stops every one at the end."""

    def __init__(self, hub_url: str, machines_dir: Path, logs: Path) -> None:
        self.hub_url = hub_url
        self.machines_dir = machines_dir
        self.logs = logs
        self.processes: list[subprocess.Popen] = []

    def environment(self, **extra: object) -> dict[str, str]:
        s = django_settings
        db = connection.settings_dict
        env = dict(os.environ)
        env.update(
            DATABASE_URL=(
                f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT']}/{db['NAME']}"
            ),
            BROKER=s.BROKER,
            QUEUE_PREFIX=s.QUEUE_PREFIX,
            RABBITMQ_EXCHANGE=s.RABBITMQ_EXCHANGE,
            REDIS_KEY_PREFIX=s.REDIS_KEY_PREFIX,
            HUB_URL=self.hub_url,
            LOCAL_MACHINES_DIR=str(self.machines_dir),
            AGENT_POLL_INTERVAL="1",
            AGENT_IDLE_TIMEOUT="30",
            WORKER_STOP_BUDGET="5",
            PYTHONUNBUFFERED="1",
        )
        env.update({name: str(value) for name, value in extra.items()})
        return env

    def start(self, name: str, *args: str, **env: object) -> subprocess.Popen:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child writes it)
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), *args],
            cwd=ROOT,
            env=self.environment(**env),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        self.processes.append(process)
        return process

    def relay(self) -> subprocess.Popen:
        return self.start("relay", "run_relay", HUBDOMMED_RELAY="true")

    def background_worker(self) -> subprocess.Popen:
        return self.start(
            "worker", "run_worker", "--queues", "critical,default", "--concurrency", "2"
        )

    def automation_worker(self, slug: str, credential: str, **env: object) -> subprocess.Popen:
        return self.start(
            f"agent-{slug}",
            "run_worker",
            "--automation",
            slug,
            HUBDOMMED_WORKER_CREDENTIAL=credential,
            # It needs no database: give it one it cannot reach, so any use shows.
            DATABASE_URL="postgres://nobody@127.0.0.1:9/no_database",
            **env,
        )

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.terminate()
        # Workers the local provider started are detached: stop them by their pid files.
        for pid_file in self.machines_dir.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()

    def log_text(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted([*self.logs.glob("*.log"), *self.machines_dir.glob("*.log")])
        )


@pytest.fixture
def system(live_server, broker_names, tmp_path):
    machines = tmp_path / "machines"
    machines.mkdir()
    system = System(live_server.url, machines, tmp_path)
    yield system
    system.stop()


@pytest.fixture
def catalog(broker_names):
    """A sector and a way to add automations that run the demo script on the local provider."""
    admin = PlatformAdminFactory()
    sector = sector_create(name=f"Demo {uuid.uuid4().hex[:6]}", actor=admin)

    def add(slug: str, **fields):
        fields.setdefault("command", DEMO)
        created = automation_create(
            name=slug.replace("-", " ").title(),
            slug=slug,
            sector_id=sector.id,
            provider="local",
            actor=admin,
            **fields,
        )
        broker_names.append(created.automation.id)
        return created

    return add


@pytest.fixture
def person(tenant):
    return UserFactory(tenant=tenant)


@pytest.fixture
def api(live_server, person):
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {issue_access_token(person).token}"
    session.base = f"{live_server.url}/api/v1"
    yield session
    session.close()


def job_status(job_id: int) -> str:
    return Job.objects.values_list("status", flat=True).get(pk=job_id)
