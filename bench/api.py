"""The API's write path and its list at scale, on one gunicorn.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_api_bench .venv/bin/python bench/api.py

(1) Throughput: ``POST /api/v1/jobs`` against ``GET /api/v1/me`` on the same gunicorn,
    in interleaved rounds (the order alternates from round to round), each endpoint driven
    by the same number of client threads for the same time; medians of the rates and of
    the per-round ratios.
(0) In one process (``--only inprocess``): both requests through Django's test client, no
    HTTP and no gunicorn, DEBUG off: the statements each sends, the CPU and wall time of
    each, and where a POST's CPU goes (cProfile, CPU time, the project's functions by
    cumulative time); then the round trips to PostgreSQL each request makes, counted
    through a proxy that holds every packet ``ROUND_TRIP_DELAY`` (a request's time is then
    that many delays, whatever the machine's load), the connection's health check and
    psycopg's BEGIN included. Load-independent evidence beside (1).
(2) The list at scale: ``--jobs`` jobs (1,000,000 by default) bulk-loaded for one tenant
    with ``generate_series`` (not through the API), then ``GET /api/v1/jobs`` with each
    filter alone, the first page and the pages after it (the cursor), one client;
    p50/p99/max of the request as the client sees it.

The database must be one of its own (its name must contain ``bench``): it is created and
migrated if needed, and emptied (``flush``) at the start, whatever a crashed run left in it,
and again at the end. Its Redis keys have a prefix of the run's own, deleted at the end.
"""

from __future__ import annotations

import argparse
import base64
import http.client
import itertools
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = uuid.uuid4().hex[:6]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")
os.environ["REDIS_KEY_PREFIX"] = f"bench-api-{RUN}"
# One token for the whole run, however long the bulk load takes.
os.environ["ACCESS_TOKEN_SECONDS"] = "86400"
# Served as in production: no DEBUG (which keeps every query in memory, among others).
os.environ["DEBUG"] = "false"
os.environ["SECRET_KEY"] = f"bench-{uuid.uuid4().hex}"
# Without DEBUG the webhook secrets need a key of their own: a new one per run.
os.environ["WEBHOOK_SECRET_KEYS"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
os.environ["ALLOWED_HOSTS"] = "127.0.0.1"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from bench.database import ensure_migrated  # noqa: E402
from bench.load import Rounds, add_load_arguments, require_quiet  # noqa: E402
from identity.tokens import issue_access_token  # noqa: E402
from outbox.wake import redis_client  # noqa: E402
from tests.factories import AutomationFactory, TenantFactory, UserFactory  # noqa: E402


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def request(port: int, method: str, path: str, token: str, body: bytes | None = None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def rate(port: int, token: str, method: str, path: str, body, *, clients: int, seconds: float):
    """Requests per second of ``clients`` threads sending the request back to back."""
    done = [0] * clients
    failures: list[str] = []
    stop = time.monotonic() + seconds

    def client(slot: int) -> None:
        while time.monotonic() < stop:
            status, payload = request(port, method, path, token, body)
            if status >= 300:
                failures.append(f"{status} {payload[:200]!r}")
                return
            done[slot] += 1

    threads = [threading.Thread(target=client, args=(slot,)) for slot in range(clients)]
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise SystemExit(f"{method} {path} failed: {failures[0]}")
    return sum(done) / (time.monotonic() - began)


def throughput(
    port: int, token: str, automation_id: int, *, rounds: int, seconds: float, clients: int
):
    body = json.dumps({"automation": automation_id, "params": {"invoice": 42}}).encode()
    parts = {
        "GET /api/v1/me": ("GET", "/api/v1/me", None),
        "POST /api/v1/jobs": ("POST", "/api/v1/jobs", body),
    }
    # Warm both paths (imports, connections, caches) before anything is timed.
    for method, path, payload in parts.values():
        rate(port, token, method, path, payload, clients=clients, seconds=1.0)
    figures: dict[str, list[float]] = {name: [] for name in parts}
    begun = Rounds()
    for number in range(rounds):
        order = list(parts) if number % 2 == 0 else list(reversed(parts))
        load = begun.start()
        for name in order:
            figures[name].append(rate(port, token, *parts[name], clients=clients, seconds=seconds))
        print(
            f"  round {number + 1} ({load} at its start): "
            + ", ".join(f"{name} {figures[name][-1]:.0f}/s" for name in parts),
            flush=True,
        )
    # The summary: the rounds that count alone.
    figures = {name: begun.kept(values) for name, values in figures.items()}
    ratios = [post / me for me, post in zip(*figures.values(), strict=True)]
    print(
        f"(1) throughput, {clients} client threads, rounds of {seconds:g} s each, "
        f"medians of {begun.note()}"
    )
    for name, values in figures.items():
        print(f"  {name:<20} median {statistics.median(values):>6.0f} req/s")
    print(
        f"  ratio POST/GET median {statistics.median(ratios):.2f} "
        f"(rounds {min(ratios):.2f}-{max(ratios):.2f})"
    )


def in_process(token: str, automation_id: int, *, requests: int) -> None:
    """Both requests in this process: statements, CPU and wall time, a POST's profile."""
    import cProfile
    import pstats

    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Bearer {token}")
    body = json.dumps({"automation": automation_id, "params": {"invoice": 42}})
    calls = {
        "GET /api/v1/me": lambda: client.get("/api/v1/me"),
        "POST /api/v1/jobs": lambda: client.post(
            "/api/v1/jobs", body, content_type="application/json"
        ),
    }
    print(f"(0) in one process (test client, DEBUG off), {requests} requests of each")
    for name, call in calls.items():
        for _ in range(50):  # warm: imports, the connection, what the process keeps
            call()
        with CaptureQueriesContext(connection) as captured:
            status = call().status_code
        if status >= 300:
            raise SystemExit(f"{name}: {status}")
        sent = [_statement(query["sql"]) for query in captured.captured_queries]
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(requests):
            call()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        print(
            f"  {name:<20} CPU {cpu / requests * 1000:.2f} ms, wall {wall / requests * 1000:.2f} "
            f"ms per request; {len(sent)} statements: {', '.join(sent)}"
        )
    # Under gunicorn each request also pays CONN_HEALTH_CHECKS' SELECT 1 (the test client
    # does not end the request's connection use, so it is not seen here).
    profile = cProfile.Profile(time.process_time)
    profile.enable()
    for _ in range(requests):
        calls["POST /api/v1/jobs"]()
    profile.disable()
    stats = pstats.Stats(profile).stats
    own = [
        (cumulative, f"{Path(file).relative_to(ROOT)}:{line}({function})")
        for (file, line, function), (_, _, _, cumulative, _) in stats.items()
        if file.startswith(str(ROOT)) and "/.venv/" not in file and "/bench/" not in file
    ]
    total = sum(own_time for (_, _, own_time, _, _) in stats.values())
    print(
        f"  where a POST's CPU goes (cProfile, which slows it down: {total / requests * 1000:.1f} "
        "ms a request profiled), the project's functions by cumulative share:"
    )
    # The middleware around everything says nothing: the view and below.
    for cumulative, where in sorted(own, reverse=True)[:20]:
        if cumulative < 0.9 * total:
            print(f"    {cumulative / total:>5.0%}  {where}")
    round_trips(calls)


# What the proxy of ``round_trips`` holds each packet: far above a request's own time.
ROUND_TRIP_DELAY = 0.05


def round_trips(calls: dict) -> None:
    """Each request's round trips to PostgreSQL, through a proxy that delays each packet."""
    import asyncio

    from django.db import close_old_connections, connections

    async def forward(reader, writer):
        try:
            while data := await reader.read(65536):
                await asyncio.sleep(ROUND_TRIP_DELAY / 2)
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    db = connections["default"]
    target = (db.settings_dict["HOST"] or "127.0.0.1", int(db.settings_dict["PORT"] or 5432))

    async def handle(client_reader, client_writer):
        server_reader, server_writer = await asyncio.open_connection(*target)
        await asyncio.gather(
            forward(client_reader, server_writer), forward(server_reader, client_writer)
        )

    ports: list[int] = []

    def serve() -> None:
        async def main() -> None:
            server = await asyncio.start_server(handle, "127.0.0.1", 0)
            ports.append(server.sockets[0].getsockname()[1])
            await server.serve_forever()

        asyncio.run(main())

    threading.Thread(target=serve, daemon=True).start()
    while not ports:
        time.sleep(0.01)
    saved = dict(db.settings_dict)
    db.close()
    db.settings_dict.update(HOST="127.0.0.1", PORT=str(ports[0]))
    print(f"  round trips to PostgreSQL (each packet held {ROUND_TRIP_DELAY * 1000:.0f} ms):")
    try:
        for name, call in calls.items():
            call()  # the connection opened, the process's terms of the automation kept
            counts = []
            for _ in range(5):
                # What gunicorn's request_started does: the next query checks the
                # connection first (CONN_HEALTH_CHECKS' SELECT 1).
                close_old_connections()
                began = time.perf_counter()
                call()
                counts.append((time.perf_counter() - began) / ROUND_TRIP_DELAY)
            print(f"    {name:<20} {statistics.median(counts):.1f}")
    finally:
        db.close()
        db.settings_dict.clear()
        db.settings_dict.update(saved)


def _statement(sql: str) -> str:
    """A statement as its verb and tables: ``SELECT users``, ``INSERT jobs + events``."""
    words = sql.replace('"', "").split()
    verb = words[0].upper()
    if verb == "SELECT":
        return f"SELECT {words[words.index('FROM') + 1]}" if "FROM" in words else "SELECT"
    if verb in ("INSERT", "WITH"):
        return "INSERT " + " + ".join(
            word for before, word in itertools.pairwise(words) if before == "INTO"
        )
    return verb


def bulk_load(*, tenant_id: int, user_id: int, automation_ids: list[int], rare_id: int, jobs: int):
    """``jobs`` jobs of the tenant over about a year, one every 30 s; ``rare_id`` has 100."""
    began = time.monotonic()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO jobs (tenant_id, automation_id, requested_by_id, status, params,
                              attempt, claim_token, lease_expires_at, error, failure_reason,
                              output_tail, created_at, updated_at, started_at, finished_at)
            SELECT %(tenant)s,
                   CASE WHEN mod(n, %(jobs)s / 100) = 5 THEN %(rare)s
                        ELSE (%(automations)s::bigint[])[1 + mod(n, %(count)s)] END,
                   %(user)s, s.status, jsonb_build_object('invoice', n),
                   CASE WHEN s.status = 'pending' THEN 0 ELSE 1 END,
                   CASE WHEN s.status = 'pending' THEN NULL ELSE gen_random_uuid() END,
                   CASE WHEN s.status = 'running' THEN now() + interval '1 hour' END,
                   CASE WHEN s.status = 'failed' THEN 'exit 1' ELSE '' END,
                   CASE WHEN s.status = 'failed' THEN 'exit_code'
                        WHEN s.status = 'canceled' THEN 'canceled' ELSE '' END,
                   '', at, at,
                   CASE WHEN s.status <> 'pending' THEN at + interval '1 second' END,
                   CASE WHEN s.status NOT IN ('pending', 'running')
                        THEN at + interval '2 seconds' END
              FROM generate_series(1, %(jobs)s) AS n,
                   -- Mostly finished, a few failed or canceled, a thin stream of pending
                   -- and running ones spread over the whole history (the worst case for
                   -- a list that would have to skip the others).
                   LATERAL (SELECT CASE WHEN mod(n, 1000) = 0 THEN 'pending'
                                        WHEN mod(n, 1000) = 1 THEN 'running'
                                        WHEN mod(n, 100) BETWEEN 2 AND 7 THEN 'failed'
                                        WHEN mod(n, 100) BETWEEN 8 AND 10 THEN 'canceled'
                                        ELSE 'succeeded' END AS status,
                                   now() - (%(jobs)s - n) * interval '30 seconds' AS at) AS s
            """,
            {
                "tenant": tenant_id,
                "user": user_id,
                "automations": automation_ids,
                "count": len(automation_ids),
                "rare": rare_id,
                "jobs": jobs,
            },
        )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE jobs")
    print(f"(2) loaded {jobs:,} jobs in {time.monotonic() - began:.0f} s (generate_series)")


def list_latency(port: int, token: str, filters: dict[str, dict], *, requests: int, pages: int):
    """Per filter: the requests as the client sees them, and the page's query alone (its
    execution time in PostgreSQL, from EXPLAIN ANALYZE: what the indexes decide, apart
    from the CPU the rest of the request competes for)."""
    print(
        f"    {'filter':<30} {'HTTP p50':>8} {'p99':>6} {'max':>6}   "
        f"{'SQL p50':>7} {'p99':>6} {'max':>6}  (ms)"
    )
    worst_http = worst_sql = 0.0
    for label, query in filters.items():
        timings: list[float] = []
        positions = []
        while len(timings) < requests:
            path = "/api/v1/jobs?" + urlencode(query)
            for _page in range(pages):
                began = time.perf_counter()
                status, payload = request(port, "GET", path, token)
                timings.append((time.perf_counter() - began) * 1000)
                if status != 200:
                    raise SystemExit(f"GET {path}: {status} {payload[:200]!r}")
                body = json.loads(payload)
                if len(positions) < pages and body["results"]:
                    positions.append(body["results"][-1]["created_at"])
                if not body["next"]:
                    break
                parts = urlsplit(body["next"])
                path = f"{parts.path}?{parts.query}"
        sql_timings = page_query_times(query, positions, runs=requests)
        http_p99, sql_p99 = percentile(timings, 0.99), percentile(sql_timings, 0.99)
        worst_http, worst_sql = max(worst_http, http_p99), max(worst_sql, sql_p99)
        print(
            f"    {label:<30} {statistics.median(timings):>8.1f} {http_p99:>6.1f} "
            f"{max(timings):>6.1f}   {statistics.median(sql_timings):>7.2f} {sql_p99:>6.2f} "
            f"{max(sql_timings):>6.2f}"
        )
    print(f"    worst p99: HTTP {worst_http:.1f} ms, SQL {worst_sql:.2f} ms (target < 50 ms)")


def page_query_times(query: dict, positions: list[str], *, runs: int) -> list[float]:
    """Execution times of the list's page query (the first page and the next ones)."""
    from job.api.serializers import JobListFilters
    from job.selectors import job_list

    filters = JobListFilters(data=query)
    filters.is_valid(raise_exception=True)
    pages = [job_list(tenant=TENANT_ID[0], **filters.as_selector_filters())]
    pages += [pages[0].filter(created_at__lt=position) for position in positions[:-1]]
    times = []
    with connection.cursor() as cursor:
        for number in range(runs):
            sql, params = pages[number % len(pages)][:51].query.sql_with_params()
            cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
            (document,) = cursor.fetchone()
            if isinstance(document, str):
                document = json.loads(document)
            times.append(document[0]["Execution Time"])
    return times


# The tenant whose jobs are listed (set once it exists).
TENANT_ID: list[int] = []


def start_gunicorn(port: int, workers: int) -> subprocess.Popen:
    return subprocess.Popen(
        [
            str(ROOT / ".venv" / "bin" / "gunicorn"),
            "hubdommed.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def wait_until_up(port: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/health/live")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise SystemExit("the API did not start")


LIST_INDEXES = ("jobs_tenant_status_recent_idx", "jobs_tenant_auto_recent_idx")


def restore_list_indexes() -> None:
    """Back to the migrated state after a run that dropped the list indexes."""
    from job.models import Job

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indexname FROM pg_indexes WHERE indexname = ANY(%s)", [list(LIST_INDEXES)]
        )
        present = {name for (name,) in cursor.fetchall()}
    with connection.schema_editor() as editor:
        for index in Job._meta.indexes:
            if index.name in LIST_INDEXES and index.name not in present:
                editor.add_index(Job, index)


def empty_database() -> None:
    call_command("flush", interactive=False, verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=5.0, help="per endpoint and round")
    parser.add_argument("--clients", type=int, default=4, help="client threads")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs loaded for the list")
    parser.add_argument("--requests", type=int, default=200, help="list requests per filter")
    parser.add_argument("--pages", type=int, default=5, help="pages followed per walk")
    parser.add_argument(
        "--inprocess-requests", type=int, default=500, help="requests of each, in process"
    )
    parser.add_argument("--only", choices=("inprocess", "throughput", "list"))
    parser.add_argument(
        "--without-list-indexes",
        action="store_true",
        help="drop the status and automation list indexes first (the figures before them)",
    )
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    # A terminated run stops its gunicorn and empties its database too (the finally below).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    name = settings.DATABASES["default"]["NAME"]
    if "bench" not in name:
        raise SystemExit(f"refusing to empty {name!r}: give DATABASE_URL a *bench* database")
    ensure_migrated()
    restore_list_indexes()  # a run --without-list-indexes may have crashed
    empty_database()

    tenant = TenantFactory(name=f"Bench {RUN}", slug=f"bench-{RUN}")
    TENANT_ID.append(tenant.pk)
    person = UserFactory(email=f"bench-{RUN}@example.com", tenant=tenant)
    automations = [AutomationFactory() for _ in range(20)]
    rare = AutomationFactory()
    token = issue_access_token(person).token
    if args.only in (None, "inprocess"):
        try:
            in_process(token, automations[0].id, requests=args.inprocess_requests)
        finally:
            # Its POSTs woke the relay too.
            redis_client().delete(settings.OUTBOX_WAKE_KEY)
        if args.only == "inprocess":
            empty_database()
            return
    port = free_port()
    server = start_gunicorn(port, args.workers)
    try:
        wait_until_up(port)
        if args.only in (None, "throughput"):
            throughput(
                port,
                token,
                automations[0].id,
                rounds=args.rounds,
                seconds=args.seconds,
                clients=args.clients,
            )
        if args.only in (None, "list"):
            with connection.cursor() as cursor:
                cursor.execute("TRUNCATE jobs, events, task_runs, outbox_messages CASCADE")
                if args.without_list_indexes:
                    for name in LIST_INDEXES:
                        cursor.execute(f"DROP INDEX {name}")
            bulk_load(
                tenant_id=tenant.id,
                user_id=person.id,
                automation_ids=[automation.id for automation in automations],
                rare_id=rare.id,
                jobs=args.jobs,
            )
            now = timezone.now()
            filters = {
                "(none)": {},
                **{f"status={status}": {"status": status} for status in _statuses()},
                "automation=<one of 20>": {"automation": automations[3].id},
                "automation=<100 jobs>": {"automation": rare.id},
                "created_after=<30 days ago>": {"created_after": _iso(now - timedelta(days=30))},
                "created_before=<180 days ago>": {
                    "created_before": _iso(now - timedelta(days=180))
                },
            }
            list_latency(port, token, filters, requests=args.requests, pages=args.pages)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        redis_client().delete(settings.OUTBOX_WAKE_KEY)
        empty_database()
        restore_list_indexes()


def _statuses() -> list[str]:
    from job.models import JobStatus

    return list(JobStatus.values)


def _iso(moment) -> str:
    return moment.isoformat().replace("+00:00", "Z")


if __name__ == "__main__":
    main()
