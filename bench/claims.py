"""Claims per second on one automation with 1, 4 and 16 concurrent claimers.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_job_bench .venv/bin/python bench/claims.py

Creates and migrates the database if needed, and works on an automation of its own.
For each level, N pending jobs wait; every claimer (a thread with its own database
connection) does what a worker's slot does: poll the oldest pending jobs, claim one
(trying the next on a refusal), complete it, and again until nothing is pending. The
limit is the number of claimers, so a claimer is refused only when another took the job
first (``already_claimed``) or the running count is full for an instant.

``--via service`` calls ``job_claim`` directly (the protocol's own cost: the lock, the
count, the update, the event); ``--via api`` goes through the HTTP API in process with the
worker's real credential (adds authentication and serialization).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402
from rest_framework.test import APIClient  # noqa: E402

from automation.authentication import hash_credential, new_credential  # noqa: E402
from automation.models import Automation, Worker  # noqa: E402
from bench.load import add_load_arguments, require_quiet  # noqa: E402
from common.errors import Conflict  # noqa: E402
from identity.models import Tenant, User  # noqa: E402
from job.models import Job  # noqa: E402
from job.selectors import jobs_pending_for  # noqa: E402
from job.services import job_claim, job_complete  # noqa: E402
from sector.models import Sector  # noqa: E402

LEVELS = (1, 4, 16)


class Setup:
    def __init__(self, max_concurrency: int) -> None:
        tag = uuid.uuid4().hex[:8]
        self.tenant = Tenant.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
        self.user = User(email=f"bench-{tag}@example.com", tenant=self.tenant)
        self.user.set_unusable_password()
        self.user.save()
        sector = Sector.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
        self.automation = Automation.objects.create(
            name=f"Bench {tag}",
            slug=f"bench-{tag}",
            sector=sector,
            command=["true"],
            max_concurrency=max_concurrency,
        )
        self.credential = new_credential()
        self.worker = Worker.objects.create(
            automation=self.automation, credential_hash=hash_credential(self.credential)
        )

    def add_pending_jobs(self, count: int) -> None:
        now = timezone.now()
        Job.objects.bulk_create(
            Job(
                tenant=self.tenant,
                automation=self.automation,
                requested_by=self.user,
                created_at=now,
                updated_at=now,
            )
            for _ in range(count)
        )


class Claimer(threading.Thread):
    def __init__(self, setup: Setup, via: str, start_line: threading.Barrier) -> None:
        super().__init__()
        self.setup = setup
        self.via = via
        self.start_line = start_line
        self.latencies: list[float] = []
        self.refusals: dict[str, int] = {}
        self.client = None
        if via == "api":
            self.client = APIClient()
            self.client.credentials(HTTP_AUTHORIZATION=f"Bearer {setup.credential}")

    def run(self) -> None:
        try:
            connection.ensure_connection()
            self.start_line.wait()
            while True:
                pending = [job.id for job in self.poll()]
                if not pending:
                    return
                # Slots of one worker spread over the oldest jobs; after a refusal the list
                # is stale, so poll again.
                self.claim_and_complete(random.choice(pending))
        finally:
            connection.close()

    def poll(self):
        return jobs_pending_for(automation_id=self.setup.automation.id, limit=20)

    def claim_and_complete(self, job_id: int) -> bool:
        started = time.perf_counter()
        if self.via == "api":
            response = self.client.post(f"/api/v1/jobs/{job_id}/start")
            self.latencies.append(time.perf_counter() - started)
            if response.status_code != 200:
                code = response.json()["error"]["code"]
                self.refusals[code] = self.refusals.get(code, 0) + 1
                return False
            self.client.post(
                f"/api/v1/jobs/{job_id}/complete",
                {"claim_token": response.json()["claim_token"]},
                format="json",
            )
            return True
        try:
            job = job_claim(worker=self.setup.worker, job_id=job_id)
        except Conflict as refusal:
            self.latencies.append(time.perf_counter() - started)
            self.refusals[refusal.code] = self.refusals.get(refusal.code, 0) + 1
            return False
        self.latencies.append(time.perf_counter() - started)
        job_complete(
            worker=self.setup.worker, job_id=job_id, claim_token=job.claim_token, result=None
        )
        return True


def commit_baseline(samples: int = 200) -> float:
    """Milliseconds of one bare INSERT and COMMIT on this machine, now: the floor of any
    write transaction, to read the claim latencies against."""
    with connection.cursor() as cursor:
        cursor.execute("CREATE TABLE IF NOT EXISTS bench_commit_probe (id int)")
    began = time.perf_counter()
    for _ in range(samples):
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_commit_probe VALUES (1)")
    elapsed = time.perf_counter() - began
    with connection.cursor() as cursor:
        cursor.execute("DROP TABLE bench_commit_probe")
    return elapsed / samples * 1000


def run_level(claimers: int, jobs: int, via: str) -> dict:
    setup = Setup(max_concurrency=claimers)
    setup.add_pending_jobs(jobs)
    start_line = threading.Barrier(claimers + 1)
    threads = [Claimer(setup, via, start_line) for _ in range(claimers)]
    for thread in threads:
        thread.start()
    start_line.wait()
    began = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began

    claimed = Job.objects.filter(automation=setup.automation, status=Job.Status.SUCCEEDED).count()
    assert claimed == jobs, f"{claimed} of {jobs} jobs ran"
    latencies = sorted(latency for thread in threads for latency in thread.latencies)
    refusals: dict[str, int] = {}
    for thread in threads:
        for code, count in thread.refusals.items():
            refusals[code] = refusals.get(code, 0) + count
    return {
        "claimers": claimers,
        "claims_per_second": jobs / elapsed,
        "p50_ms": statistics.median(latencies) * 1000,
        "p95_ms": latencies[int(len(latencies) * 0.95) - 1] * 1000,
        "refusals": refusals,
        "elapsed": elapsed,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=400, help="pending jobs per level")
    parser.add_argument("--via", choices=("service", "api"), default="service")
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)

    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)

    print(f"bare INSERT + COMMIT: {commit_baseline():.1f} ms")
    print(f"claims via {args.via}, {args.jobs} jobs per level (claim + complete each)")
    print(f"{'claimers':>8} {'claims/s':>9} {'p50 ms':>7} {'p95 ms':>7}  refusals")
    for level in args.levels:
        row = run_level(level, args.jobs, args.via)
        refusals = ", ".join(f"{code} {n}" for code, n in sorted(row["refusals"].items()))
        print(
            f"{row['claimers']:>8} {row['claims_per_second']:>9.0f} {row['p50_ms']:>7.1f} "
            f"{row['p95_ms']:>7.1f}  {refusals or '-'}"
        )


if __name__ == "__main__":
    main()
