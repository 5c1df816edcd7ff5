"""End to end: from POST /api/v1/jobs to the job running, and to it succeeding.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hubdommed_bench .venv/bin/python bench/e2e.py

Starts the real system on loopback against that database (created and migrated if
needed): the API under gunicorn, the relay and one automation worker already running
(warm) for an automation whose command does nothing. Jobs are posted over HTTP at a
steady rate; the job's own timestamps (set by the API: created, started by the claim,
finished by the report) give the two latencies, so polling adds nothing to them. Uses its
own queue prefix, exchange and Redis prefix, and removes its queues at the end.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = uuid.uuid4().hex[:6]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")
os.environ["QUEUE_PREFIX"] = f"bench-{RUN}-"
os.environ["RABBITMQ_EXCHANGE"] = f"dom_med_bench_{RUN}"
os.environ["REDIS_KEY_PREFIX"] = f"bench-{RUN}"

import django  # noqa: E402

django.setup()

import pika  # noqa: E402
import requests  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402

from automation.models import Worker  # noqa: E402
from automation.services import automation_create  # noqa: E402
from bench.load import add_load_arguments, require_quiet  # noqa: E402
from broker import topology  # noqa: E402
from broker.topology import QUEUES  # noqa: E402
from identity.tokens import issue_access_token  # noqa: E402
from job.models import Job  # noqa: E402
from sector.services import sector_create  # noqa: E402
from tests.factories import PlatformAdminFactory, TenantFactory, UserFactory  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def start(*args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        list(args),
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--rate", type=float, default=5.0, help="jobs posted per second")
    parser.add_argument("--concurrency", type=int, default=4, help="the automation's limit")
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)

    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)

    admin = PlatformAdminFactory(email=f"bench-admin-{RUN}@example.com")
    tenant = TenantFactory(name=f"Bench {RUN}", slug=f"bench-{RUN}")
    person = UserFactory(email=f"bench-{RUN}@example.com", tenant=tenant)
    sector = sector_create(name=f"Bench {RUN}", actor=admin)
    created = automation_create(
        name=f"No-op {RUN}",
        sector_id=sector.id,
        command=["/bin/true"],
        max_concurrency=args.concurrency,
        provider="local",
        actor=admin,
    )
    automation = created.automation
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    processes = [
        start(
            str(ROOT / ".venv" / "bin" / "gunicorn"),
            "hubdommed.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            "2",
        ),
        start(sys.executable, "manage.py", "run_relay", HUBDOMMED_RELAY="true"),
    ]
    try:
        wait_for(lambda: _up(url), 30, "the API")
        processes.append(
            start(
                sys.executable,
                "manage.py",
                "run_worker",
                "--automation",
                automation.slug,
                HUB_URL=url,
                HUBDOMMED_WORKER_CREDENTIAL=created.credential,
                AGENT_IDLE_TIMEOUT="0",
            )
        )
        wait_for(
            lambda: Worker.objects.filter(automation=automation, status="online").exists(),
            30,
            "the warm worker",
        )
        time.sleep(1.0)  # its queue consumer is up too

        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {issue_access_token(person).token}"
        ids = []
        began = time.monotonic()
        for n in range(args.jobs):
            due = began + n / args.rate
            time.sleep(max(0.0, due - time.monotonic()))
            response = session.post(
                f"{url}/api/v1/jobs", json={"automation": automation.id, "params": {"n": n}}
            )
            response.raise_for_status()
            ids.append(response.json()["id"])
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, status="succeeded").count() == len(ids),
            120,
            "the jobs to succeed",
        )
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=30)
        _delete_queues(automation.id)

    jobs = Job.objects.filter(pk__in=ids).values_list("created_at", "started_at", "finished_at")
    to_running = [(started - created).total_seconds() * 1000 for created, started, _ in jobs]
    to_done = [(finished - created).total_seconds() * 1000 for created, _, finished in jobs]
    print(f"{len(ids)} jobs at {args.rate:g}/s, automation limit {args.concurrency}, warm worker")
    print(f"{'':<22} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, values in (("POST -> running", to_running), ("POST -> succeeded", to_done)):
        print(
            f"{label:<22} {statistics.median(values):>8.1f} {percentile(values, 0.99):>8.1f} "
            f"{max(values):>8.1f}"
        )


def _up(url: str) -> bool:
    try:
        return requests.get(f"{url}/health/live", timeout=1).status_code == 200
    except requests.RequestException:
        return False


def _delete_queues(automation_id: int) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        for destination in (*QUEUES, f"automation-{automation_id}"):
            channel.queue_delete(topology.queue_name(destination))
            channel.queue_delete(topology.dead_letter_queue_name(destination))
        channel.exchange_delete(settings.RABBITMQ_EXCHANGE)
    finally:
        conn.close()


if __name__ == "__main__":
    main()
