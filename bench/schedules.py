"""Ten thousand schedules due at once, and how late a lone due run starts.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_sched_bench \
        .venv/bin/python bench/schedules.py --schedules 10000 --rounds 3

Creates and migrates the database if needed, and works on tenants and automations of its
own. Each round, interleaved, measures:

- the bare INSERT + COMMIT, the floor of any write transaction, in the same run;
- "due now", the everyday burst: N schedules of 50 tenants with one daily cron line (the
  minute the round starts, as "0 9 * * *" is at 09:00) due at that minute, fired by one
  and then by two firings (processes of their own, as ``run_scheduler`` processes are)
  calling ``schedules_fire_due`` batch after batch until nothing is due: the time until
  every job exists, jobs per second, the firings' CPU time per batch, and the check that
  each (schedule, due time) started exactly one job, the one due at that minute;
- "a year late", the same N schedules of a yearly line whose due time passed months ago
  (the hub was down): each takes the misfire path (``calendar.latest_due_between``, the
  latest missed due time), fired by one firing;
- the lateness of a lone due run: a real ``manage.py run_scheduler`` (default interval),
  a schedule created while it sleeps, due at the next minute; the time from its due time
  to its job's creation.

Printed: each round with the load average at its start, then the medians (p50/p99 of the
lateness over the rounds). A figure taken at a load average above 2 does not count; the
CPU time per batch says where a noisy round's time went. ``--smoke`` is a short form that
proves the command works (100 schedules, one round). ``--steps "due now"`` (or ``"a year
late"``) only fires the N schedules in this process and prints each step's CPU and wall time
per batch: where a batch's time goes.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import multiprocessing
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from automation.models import Automation  # noqa: E402
from bench.database import ensure_migrated  # noqa: E402
from bench.load import Rounds, add_load_arguments, load_note, require_quiet  # noqa: E402
from identity.models import Tenant  # noqa: E402
from job.models import Job  # noqa: E402
from schedule.firing import schedules_fire_due  # noqa: E402
from schedule.models import Schedule  # noqa: E402
from schedule.services import schedule_create, schedule_deactivate  # noqa: E402
from sector.models import Sector  # noqa: E402

# (case, firings) in each round: the everyday burst by one and two schedulers, and the
# misfire path by one.
LEVELS = (("due now", 1), ("due now", 2), ("a year late", 1))
# Tenants the due schedules belong to (a tenant holds at most SCHEDULE_MAX_PER_TENANT).
TENANTS = 50


def owners() -> tuple[list[Tenant], Automation]:
    tag = uuid.uuid4().hex[:8]
    tenants = [
        Tenant.objects.create(name=f"Bench {tag} {n}", slug=f"bench-{tag}-{n}")
        for n in range(TENANTS)
    ]
    sector = Sector.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
    automation = Automation.objects.create(
        name=f"Bench {tag}", slug=f"bench-{tag}", sector=sector, command=["true"]
    )
    return tenants, automation


def setup(case: str, count: int) -> tuple[list[Tenant], list[int], datetime]:
    """N schedules due at once; returns their tenants, ids and due time."""
    tenants, automation = owners()
    now = timezone.now()
    if case == "due now":
        # One daily line, due at this minute: the due time is at most a few seconds old
        # when the firing starts, well within the grace, so each starts on time.
        due = now.replace(second=0, microsecond=0)
        cron = f"{due.minute} {due.hour} * * *"
    else:
        # A yearly line whose due time passed months ago: each schedule runs its latest
        # missed due time once (misfire run_once), found by the calendar's walk back.
        due = now.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
        cron = "0 0 1 1 *"
    schedules = Schedule.objects.bulk_create(
        Schedule(
            tenant=tenants[n % TENANTS],
            automation=automation,
            name=f"s{n}",
            cron=cron,
            timezone="UTC",
            params={"n": n},
            next_run_at=due,
        )
        for n in range(count)
    )
    return tenants, [schedule.pk for schedule in schedules], due


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


def fire_until_done(start_line, results) -> None:
    """One firing, in a process of its own: batch after batch until nothing is due."""
    gc.freeze()  # what it loaded to start, out of the collector's sight, as run_scheduler's
    try:
        start_line.wait()
        batches: list[tuple[float, float]] = []
        while True:
            began, cpu = time.perf_counter(), time.process_time()
            firing = schedules_fire_due()
            batches.append(
                ((time.perf_counter() - began) * 1000, (time.process_time() - cpu) * 1000)
            )
            if not firing.more:
                break
        results.put((time.monotonic(), batches, None))
    except BaseException as exc:  # reported by the parent
        results.put((time.monotonic(), [], repr(exc)))
    finally:
        connection.close()


def run_level(case: str, firings: int, count: int) -> dict:
    tenants, ids, due = setup(case, count)
    context = multiprocessing.get_context("spawn")
    start_line = context.Barrier(firings + 1)
    results = context.Queue()
    processes = [
        context.Process(target=fire_until_done, args=(start_line, results)) for _ in range(firings)
    ]
    for process in processes:
        process.start()
    start_line.wait()  # every firing is up (Django set up, modules imported)
    began = time.monotonic()
    reports = [results.get(timeout=600) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    errors = [error for _, _, error in reports if error]
    if errors:
        raise SystemExit(f"a firing failed: {errors}")
    wall = max(ended for ended, _, _ in reports) - began
    batches = [batch for _, done, _ in reports for batch in done]

    jobs = Job.objects.filter(tenant__in=tenants)
    runs = Counter(
        (j["triggered_by"]["schedule"], j["triggered_by"]["due_at"])
        for j in jobs.values("triggered_by")
    )
    return {
        "case": case,
        "firings": firings,
        "schedules": count,
        "jobs": sum(runs.values()),
        "most_per_due_time": max(runs.values()),
        "wall_s": wall,
        "jobs_per_s": sum(runs.values()) / wall,
        "batch_p50_ms": statistics.median(wall_ms for wall_ms, _ in batches),
        "batch_cpu_p50_ms": statistics.median(cpu_ms for _, cpu_ms in batches),
        "all_started": set(schedule for schedule, _ in runs) == set(ids),
        "due_at_as_set": {due_at for _, due_at in runs} == {due.isoformat()},
    }


def lateness_of_a_lone_run(env: dict[str, str]) -> float:
    """Seconds from a lone schedule's due time to its job, under a real ``run_scheduler``
    that was asleep when the schedule was created (it wakes on the change, then sleeps
    until the due time)."""
    tenants, automation = owners()
    with tempfile.TemporaryDirectory() as tmp:
        alive = Path(tmp) / "scheduler.alive"
        process = subprocess.Popen(
            [sys.executable, "manage.py", "run_scheduler"],
            cwd=ROOT,
            env={**env, "LIVENESS_FILE": str(alive)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait(alive.exists, 60, "the scheduler's first cycle")
            # At least two seconds before the minute: created while the scheduler sleeps.
            while timezone.now().second >= 58:
                time.sleep(0.1)
            schedule = schedule_create(
                tenant=tenants[0],
                actor=None,
                automation_id=automation.pk,
                cron="* * * * *",
                params={},
            )
            job = _wait(
                lambda: Job.objects.filter(triggered_by__schedule=schedule.pk).first(),
                90,
                "the lone run's job",
            )
            schedule_deactivate(tenant=tenants[0], schedule_id=schedule.pk)
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
    return (job.created_at - schedule.next_run_at).total_seconds()


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise SystemExit(f"gave up after {timeout:g} s waiting for {what}")


# The steps of one batch, as the functions that do them (module, name): ``--steps`` times
# each in-process, its own time without the steps it calls.
STEPS = (
    ("plan: read the due rows, search the calendar", "schedule.firing", "schedules_plan_due"),
    ("lock the rows, read tenants and automations", "schedule.firing", "_locked"),
    ("read the due times already started", "schedule.firing", "_already_started"),
    ("jobs: check, build, INSERT", "schedule.firing", "jobs_create_many"),
    ("events, task runs, outbox rows (publish_many)", "job.batch", "publish_many"),
    ("webhook deliveries (the listener)", "outbox.services", "notify_listeners_of_many"),
    ("schedule_runs INSERT", "schedule.firing", "_record_runs"),
    ("schedules UPDATE", "schedule.firing", "_save_all"),
)


def steps(case: str, count: int) -> None:
    """Where one firing's time goes, batch by batch, in this process: each step's CPU and
    wall time per batch (the rest: transactions, the commit, the Python between steps)."""
    spent: dict[str, list[float]] = {label: [0.0, 0.0] for label, _, _ in STEPS}
    nested: list[list[float]] = []

    def timed(label: str, function):
        def step(*args, **kwargs):
            nested.append([0.0, 0.0])
            began, cpu = time.perf_counter(), time.process_time()
            try:
                return function(*args, **kwargs)
            finally:
                wall, used = time.perf_counter() - began, time.process_time() - cpu
                inner = nested.pop()
                spent[label][0] += used - inner[0]
                spent[label][1] += wall - inner[1]
                if nested:
                    nested[-1][0] += used
                    nested[-1][1] += wall

        return step

    for label, module, name in STEPS:
        owner = importlib.import_module(module)
        if hasattr(owner, name):  # an earlier version may not have it (for a comparison)
            setattr(owner, name, timed(label, getattr(owner, name)))
    # A first small firing, not counted: imports, the connection, Django's first queries.
    setup(case, 20)
    while schedules_fire_due().more:
        pass
    for totals in spent.values():
        totals[:] = [0.0, 0.0]
    gc.freeze()  # what it loaded to start, out of the collector's sight, as run_scheduler's
    setup(case, count)
    batches, began, cpu = 0, time.perf_counter(), time.process_time()
    while True:
        firing = schedules_fire_due()
        batches += bool(firing.applied)  # the last call may find nothing left
        if not firing.more:
            break
    wall, used = time.perf_counter() - began, time.process_time() - cpu
    print(f"{case}: {count} schedules in {batches} batches, {load_note()}")
    print("| step | CPU ms per batch | wall ms per batch |")
    print("|---|---|---|")
    for label, (step_cpu, step_wall) in spent.items():
        print(f"| {label} | {step_cpu / batches * 1000:.1f} | {step_wall / batches * 1000:.1f} |")
    rest_cpu = used - sum(c for c, _ in spent.values())
    rest_wall = wall - sum(w for _, w in spent.values())
    print(
        f"| the rest (transactions, commit, between steps) | {rest_cpu / batches * 1000:.1f} "
        f"| {rest_wall / batches * 1000:.1f} |"
    )
    print(f"| **a batch** | **{used / batches * 1000:.1f}** | **{wall / batches * 1000:.1f}** |")


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--schedules", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="100 schedules, one round")
    parser.add_argument(
        "--steps",
        choices=[case for case, firings in LEVELS if firings == 1],
        help="only time each step of one firing's batches, in this process",
    )
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    if args.smoke:
        args.schedules, args.rounds = 100, 1
    ensure_migrated()
    if args.steps:
        steps(args.steps, args.schedules)
        return
    db = connection.settings_dict
    env = {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
    }
    print(
        "| round | load | bare commit ms | case | firings | schedules | jobs "
        "| most per due time | until every job s | jobs/s | batch p50 ms "
        "| batch CPU p50 ms | lone run late s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    walls: dict[tuple[str, int], list[float]] = {level: [] for level in LEVELS}
    commits: list[float] = []
    late: list[float] = []
    # Each measure's rounds, and which of them count (the load at its start).
    begun = {key: Rounds() for key in [*LEVELS, "commit", "late"]}
    for n in range(1, args.rounds + 1):
        begun["commit"].start()
        commit = commit_baseline()
        commits.append(commit)
        for case, firings in LEVELS:
            load = begun[case, firings].start()
            r = run_level(case, firings, args.schedules)
            assert r["all_started"] and r["most_per_due_time"] == 1, r
            assert r["due_at_as_set"], r
            walls[case, firings].append(r["wall_s"])
            print(
                f"| {n} | {load} | {commit:.2f} | {case} | {firings} | {r['schedules']} "
                f"| {r['jobs']} | {r['most_per_due_time']} | {r['wall_s']:.2f} "
                f"| {r['jobs_per_s']:.0f} | {r['batch_p50_ms']:.0f} "
                f"| {r['batch_cpu_p50_ms']:.0f} | |",
                flush=True,
            )
        load = begun["late"].start()
        late.append(lateness_of_a_lone_run(env))
        print(f"| {n} | {load} | | | | | | | | | | | {late[-1]:.3f} |", flush=True)
    print()
    print(
        f"bare INSERT + COMMIT, median: {statistics.median(begun['commit'].kept(commits)):.2f} ms"
        f" (of {begun['commit'].note()})"
    )
    for case, firings in LEVELS:
        median = statistics.median(begun[case, firings].kept(walls[case, firings]))
        print(
            f"{case}, {firings} firing(s): every one of {args.schedules} jobs in "
            f"{median:.2f} s (median of {begun[case, firings].note()}), "
            f"{args.schedules / median:.0f} jobs/s"
        )
    kept_late = begun["late"].kept(late)
    print(
        f"lone due run, late by: p50 {percentile(kept_late, 0.5):.3f} s, "
        f"p99 {percentile(kept_late, 0.99):.3f} s (over {begun['late'].note()})"
    )


if __name__ == "__main__":
    main()
