"""Scheduled runs started per second when many schedules fall due at once, by 1 and 2 firings.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_schedule_bench \
        .venv/bin/python bench/schedules.py --schedules 1000

Creates and migrates the database if needed, and works on a tenant and automation of its
own. For each level, N schedules of one cron expression fall due at the same time; one
or two firings (threads, each with its own database connection, as ``run_scheduler``
processes would be) call ``schedules_fire_due`` batch after batch until nothing is due.
Reported: the wall time until every schedule started its job, jobs started per second, the
latency of one batch, and the check that each due time started exactly one job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
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

from automation.models import Automation  # noqa: E402
from identity.models import Tenant  # noqa: E402
from job.models import Job  # noqa: E402
from schedule.firing import schedules_fire_due  # noqa: E402
from schedule.models import Schedule  # noqa: E402
from sector.models import Sector  # noqa: E402

LEVELS = (1, 2)
BATCH = 100


def setup(count: int) -> tuple[Tenant, list[int]]:
    tag = uuid.uuid4().hex[:8]
    tenant = Tenant.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
    sector = Sector.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
    automation = Automation.objects.create(
        name=f"Bench {tag}", slug=f"bench-{tag}", sector=sector, command=["true"]
    )
    # A yearly expression: each schedule is due once in the run, however long it takes.
    due = timezone.now().replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
    schedules = Schedule.objects.bulk_create(
        Schedule(
            tenant=tenant,
            automation=automation,
            name=f"s{n}",
            cron="0 0 1 1 *",
            timezone="UTC",
            params={"n": n},
            next_run_at=due,
        )
        for n in range(count)
    )
    return tenant, [schedule.pk for schedule in schedules]


def commit_baseline(samples: int = 200) -> float:
    """Milliseconds of one bare INSERT and COMMIT now: the floor of any write transaction."""
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


def run_level(firings: int, count: int) -> dict:
    tenant, ids = setup(count)
    start_line = threading.Barrier(firings)
    batch_ms: list[float] = []
    lock = threading.Lock()

    def fire() -> None:
        try:
            start_line.wait()
            while True:
                began = time.perf_counter()
                firing = schedules_fire_due(batch_size=BATCH)
                with lock:
                    batch_ms.append((time.perf_counter() - began) * 1000)
                if not firing.more:
                    break
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(firings)]
    began = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - began

    jobs = Job.objects.filter(tenant=tenant)
    runs = Counter(
        (j["triggered_by"]["schedule"], j["triggered_by"]["due_at"])
        for j in jobs.values("triggered_by")
    )
    return {
        "firings": firings,
        "schedules": count,
        "jobs": sum(runs.values()),
        "most_per_due_time": max(runs.values()),
        "wall_s": wall,
        "jobs_per_s": sum(runs.values()) / wall,
        "batch_p50_ms": statistics.median(batch_ms),
        "batch_max_ms": max(batch_ms),
        "all_started": set(schedule for schedule, _ in runs) == set(ids),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    args = parser.parse_args()
    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)
    print(f"bare INSERT + COMMIT: {commit_baseline():.1f} ms")
    print(
        "| firings | schedules | jobs | most per due time | wall s | jobs/s "
        "| batch p50 ms | batch max ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for firings in LEVELS:
        r = run_level(firings, args.schedules)
        assert r["all_started"] and r["most_per_due_time"] == 1, r
        print(
            f"| {r['firings']} | {r['schedules']} | {r['jobs']} | {r['most_per_due_time']} "
            f"| {r['wall_s']:.1f} | {r['jobs_per_s']:.0f} | {r['batch_p50_ms']:.0f} "
            f"| {r['batch_max_ms']:.0f} |"
        )


if __name__ == "__main__":
    main()
