"""The events trail at scale: a page of ``GET /api/v1/events`` at ten million events.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_events_bench \
        .venv/bin/python bench/events.py --events 10000000

Fills ``events`` with ``--events`` rows (10,000,000 by default) by ``INSERT ... SELECT
generate_series`` in chunks, its indexes built once it is full (as ``CREATE INDEX`` on a
table of that size would be); then ``VACUUM ANALYZE``. The trail spans a year, one event
after another in id order (with the jitter of a few milliseconds that concurrent writers
give), of eight tenants, one of them holding half of it and one a hundredth, and of the
platform (no tenant): job events most, a few of the rarer kinds, the tenants' people,
the workers, the daemons and the tasks as actors.

Then, for the list with no filter and with each filter alone, as the big tenant's
manager, the small tenant's and a platform admin across tenants: the selector
(``outbox.selectors.event_list``, whose time bounds are read as the request reads them)
and its SQL for the first page and for a deep page (the cursor at an id nine tenths of
the way down the trail), each ``--repeat`` times; p50/p99 in milliseconds. The same for
the jobs list's first and deep page (``job.selectors.job_list``, ``--jobs`` jobs of one
tenant) as the reference.

The database must be one of its own (its name must contain ``bench``): created and
migrated if needed, emptied at the start and at the end. A figure taken at a load average
above 2 does not count (``--allow-load`` measures anyway and says so). ``--smoke`` is a
short form that proves the command works (20,000 events, 2,000 jobs, one round of 5).
"""

from __future__ import annotations

import argparse
import base64
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")
# As in production: no DEBUG, which keeps every query in memory and times it.
os.environ["DEBUG"] = "false"
os.environ["SECRET_KEY"] = f"bench-{uuid.uuid4().hex}"
# Without DEBUG the webhook secrets need a key of their own: a new one per run.
os.environ["WEBHOOK_SECRET_KEYS"] = base64.urlsafe_b64encode(os.urandom(32)).decode()

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.db.models import QuerySet  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.load import add_load_arguments, load_note, require_quiet  # noqa: E402
from identity.models import Tenant  # noqa: E402
from job.selectors import job_list  # noqa: E402
from outbox.selectors import event_list  # noqa: E402
from tests.factories import AutomationFactory, TenantFactory, UserFactory  # noqa: E402

PAGE = 51  # the cursor pagination reads one row more than the page
CHUNK = 1_000_000
YEAR_SECONDS = 365 * 86400.0
# Each tenant's share of the trail, in thousandths; the platform's own events are the rest.
SHARES = (500, 200, 100, 80, 50, 30, 10)
PLATFORM_SHARE = 1000 - sum(SHARES)
# Event types by weight (out of 1000): what a hub of jobs writes, and a few rare ones.
TYPES = (
    ("JobCreated", 240),
    ("JobStarted", 240),
    ("JobSucceeded", 210),
    ("JobFailed", 20),
    ("JobCanceled", 10),
    ("WebhookDeliveryFailed", 250),
    ("ScheduleCreated", 20),
    ("UserRegistered", 9),
    ("TenantRenamed", 1),
)


def fill_events(*, tenant_ids: list[int], events: int) -> None:
    """``events`` rows over the last year, in id order, in chunks of ``CHUNK``."""
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'events' "
            "AND indexname <> 'events_pkey'"
        )
        indexes = cursor.fetchall()
        for index_name, _ in indexes:
            cursor.execute(f'DROP INDEX "{index_name}"')
        cursor.execute("ALTER TABLE events SET (autovacuum_enabled = false)")
    try:
        _insert_events(tenant_ids=tenant_ids, events=events, began=began)
    finally:
        # Built again even when the fill fails: the next run's database has them all.
        index_began = time.monotonic()
        with connection.cursor() as cursor:
            cursor.execute("SET maintenance_work_mem = '512MB'")
            for _, definition in indexes:
                cursor.execute(definition)
            cursor.execute("ALTER TABLE events RESET (autovacuum_enabled)")
            cursor.execute("VACUUM ANALYZE events")
    print(
        f"loaded {events:,} events in {time.monotonic() - began:.0f} s "
        f"({len(indexes)} indexes and VACUUM ANALYZE: {time.monotonic() - index_began:.0f} s)",
        flush=True,
    )


def _insert_events(*, tenant_ids: list[int], events: int, began: float) -> None:
    # Who and what each of a thousand slots is: a row's slot picks its tenant and its type.
    tenant_of = [
        tenant_id for tenant_id, share in zip(tenant_ids, SHARES, strict=True) for _ in range(share)
    ] + [None] * PLATFORM_SHARE
    type_of = [name for name, weight in TYPES for _ in range(weight)]
    for start in range(1, events + 1, CHUNK):
        end = min(events, start + CHUNK - 1)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO events (type, aggregate_type, aggregate_id, tenant_id, actor,
                                    payload, correlation_id, occurred_at)
                SELECT e.type,
                       CASE WHEN e.type LIKE 'Job%%' THEN 'Job'
                            WHEN e.type LIKE 'Webhook%%' THEN 'WebhookDelivery'
                            WHEN e.type LIKE 'Schedule%%' THEN 'Schedule'
                            WHEN e.type = 'UserRegistered' THEN 'User'
                            ELSE 'Tenant' END,
                       (n / 4)::text,
                       e.tenant_id,
                       CASE WHEN e.type IN ('JobCreated', 'UserRegistered', 'TenantRenamed')
                                 AND e.tenant_id IS NOT NULL
                            THEN 'user:' || (e.tenant_id * 100 + mod(n, 40))
                            WHEN e.type LIKE 'Job%%' THEN 'worker:' || mod(n, 30)
                            WHEN e.type LIKE 'Webhook%%' THEN 'task:webhook.deliver'
                            ELSE 'system' END,
                       jsonb_build_object('n', n), 'bench-' || (n / 4),
                       now() - make_interval(secs => %(year)s * (%(events)s - n) / %(events)s)
                           + random() * interval '5 milliseconds'
                  FROM generate_series(%(start)s, %(end)s) AS n,
                       LATERAL (SELECT floor(random() * 1000)::int + n * 0 AS t,
                                       floor(random() * 1000)::int + n * 0 AS k) AS s,
                       LATERAL (SELECT (%(tenant_of)s::bigint[])[1 + s.t] AS tenant_id,
                                       (%(type_of)s::text[])[1 + s.k] AS type) AS e
                """,
                {
                    "events": events,
                    "year": YEAR_SECONDS,
                    "start": start,
                    "end": end,
                    "tenant_of": tenant_of,
                    "type_of": type_of,
                },
            )
        print(f"  {end:,} events, {time.monotonic() - began:.0f} s", flush=True)


def fill_jobs(*, tenant_id: int, user_id: int, automation_ids: list[int], jobs: int) -> None:
    """The reference: ``jobs`` jobs of one tenant over the same year."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobs (tenant_id, automation_id, requested_by_id, status, params,
                              attempt, error, failure_reason, output_tail,
                              created_at, updated_at)
            SELECT %(tenant)s, (%(automations)s::bigint[])[1 + mod(n, %(count)s)], %(user)s,
                   'succeeded', '{}'::jsonb, 1, '', '', '', at, at
              FROM generate_series(1, %(jobs)s) AS n,
                   LATERAL (SELECT now() - make_interval(
                                       secs => %(year)s * (%(jobs)s - n) / %(jobs)s) AS at) AS s
            """,
            {
                "tenant": tenant_id,
                "user": user_id,
                "automations": automation_ids,
                "count": len(automation_ids),
                "jobs": jobs,
                "year": YEAR_SECONDS,
            },
        )
        cursor.execute("VACUUM ANALYZE jobs")


def timed(build: Callable[[], QuerySet], repeat: int) -> tuple[list[float], list[float], int]:
    """The durations (ms) of running the page's SQL, and of the whole read (the selector,
    its own reads of a time range's bounds, the SQL compiled and run), and the rows."""
    sql_times, whole_times, rows = [], [], 0
    for _ in range(repeat):
        began = time.perf_counter()
        sql, params = build().query.sql_with_params()
        with connection.cursor() as cursor:
            sent = time.perf_counter()
            cursor.execute(sql, params)
            rows = len(cursor.fetchall())
        done = time.perf_counter()
        sql_times.append((done - sent) * 1000)
        whole_times.append((done - began) * 1000)
    return sql_times, whole_times, rows


def figures(build: Callable[[], QuerySet], repeat: int) -> str:
    sql_times, whole_times, rows = timed(build, repeat)
    return (
        f"{percentile(sql_times, 0.5):.2f} / {percentile(sql_times, 0.99):.2f} "
        f"| {percentile(whole_times, 0.5):.2f} | {rows}"
    )


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def event_filters(big_tenant_id: int) -> dict[str, dict]:
    now = timezone.now()
    return {
        "(none)": {},
        "type=JobCreated (a quarter)": {"types": ["JobCreated"]},
        "type=TenantRenamed (1 in 1000)": {"types": ["TenantRenamed"]},
        "type=JobFailed,JobCanceled": {"types": ["JobFailed", "JobCanceled"]},
        "actor=system": {"actor": "system"},
        "actor=user:<one of the big tenant>": {"actor": f"user:{big_tenant_id * 100 + 7}"},
        "aggregate_type=Job": {"aggregate_type": "Job"},
        "aggregate_type=Schedule": {"aggregate_type": "Schedule"},
        "aggregate_type=Job&aggregate_id=<one>": {
            "aggregate_type": "Job",
            "aggregate_id": "1234567",
        },
        "occurred_after=<30 days ago>": {"occurred_after": now - timedelta(days=30)},
        "occurred_before=<180 days ago>": {"occurred_before": now - timedelta(days=180)},
        "an hour 200 days ago": {
            "occurred_after": now - timedelta(days=200, hours=1),
            "occurred_before": now - timedelta(days=200),
        },
        "type=JobFailed, last 7 days": {
            "types": ["JobFailed"],
            "occurred_after": now - timedelta(days=7),
        },
    }


def measure(tenants: list[int], deep_id: int, *, repeat: int, jobs_tenant: int, deep_job_at):
    callers = {
        "big tenant": {"caller_tenant_id": tenants[0], "platform_admin": False},
        "small tenant": {"caller_tenant_id": tenants[-1], "platform_admin": False},
        "platform admin": {"caller_tenant_id": None, "platform_admin": True},
    }
    filters = event_filters(tenants[0])
    print(f"\nevents list, {repeat} runs each, {load_note()}")
    print(
        "SQL: the page's statement; whole: the selector (with a time range's bound reads), "
        "compiled and run"
    )
    print(
        "| caller | filter | first page SQL p50 / p99 ms | whole p50 | rows "
        "| deep page SQL p50 / p99 ms | whole p50 | rows |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for caller, scope in callers.items():
        extra = {"tenant=<one>": {"tenant_id": tenants[1]}} if caller == "platform admin" else {}
        for label, selector_filters in {**filters, **extra}.items():

            def first(scope=scope, selector_filters=selector_filters):
                return event_list(**scope, **selector_filters)[:PAGE]

            def deep(scope=scope, selector_filters=selector_filters):
                return event_list(**scope, **selector_filters).filter(id__lt=deep_id)[:PAGE]

            print(
                f"| {caller} | `{label}` | {figures(first, repeat)} | {figures(deep, repeat)} |",
                flush=True,
            )

    def jobs_first():
        return job_list(tenant=jobs_tenant)[:PAGE]

    def jobs_deep():
        return job_list(tenant=jobs_tenant).filter(created_at__lt=deep_job_at)[:PAGE]

    print(
        f"| (reference) | jobs list, no filter | {figures(jobs_first, repeat)} "
        f"| {figures(jobs_deep, repeat)} |",
        flush=True,
    )
    print(f"({load_note()} at the end)")


def empty_database() -> None:
    call_command("flush", interactive=False, verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs of the reference")
    parser.add_argument("--repeat", type=int, default=200, help="runs of each query")
    parser.add_argument("--smoke", action="store_true", help="20,000 events, 5 runs each")
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    if args.smoke:
        args.events, args.jobs, args.repeat = 20_000, 2_000, 5

    name = settings.DATABASES["default"]["NAME"]
    if "bench" not in name:
        raise SystemExit(f"refusing to empty {name!r}: give DATABASE_URL a *bench* database")
    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)
    empty_database()
    try:
        tenants = [TenantFactory().pk for _ in SHARES]
        person = UserFactory(tenant=Tenant.objects.get(pk=tenants[0]))
        automations = [AutomationFactory().pk for _ in range(20)]
        print(f"filling {args.events:,} events, {load_note()}", flush=True)
        fill_events(tenant_ids=tenants, events=args.events)
        fill_jobs(
            tenant_id=tenants[0], user_id=person.pk, automation_ids=automations, jobs=args.jobs
        )
        with connection.cursor() as cursor:
            cursor.execute("SELECT min(id) + (max(id) - min(id)) / 10 FROM events")
            (deep_id,) = cursor.fetchone()
        deep_job_at = timezone.now() - timedelta(days=330)
        measure(
            tenants,
            deep_id,
            repeat=args.repeat,
            jobs_tenant=tenants[0],
            deep_job_at=deep_job_at,
        )
    finally:
        empty_database()


if __name__ == "__main__":
    main()
