"""The statements on a window of runs read the window's rows, not the backlog behind them.

The worker claims, extends and commits the runs of a window by key (``outbox.runs``), and
the relay notes the broker's refusals on the runs of a batch (``outbox.delivery``). Each
also requires a status (a claim takes a ``queued`` run, a commit a ``running`` one), and
``task_runs_unfinished_idx`` answers "every run of that status": a planner that trusts
statistics taken before a burst (a history of finished runs, then thousands queued at
once, fewer than autovacuum's threshold for a new ``ANALYZE``) took that path and walked
every queued run for each window of 64: 100 ms a claim at a backlog of 10,000, growing
with it, just when the burst needs the worker fastest.

The plans are taken in that very state, prepared as the worker prepares them, with
PostgreSQL's own choice between a custom and a generic plan forced each way; what each
must show is that its scans read a bounded number of rows per run of the window, and, for
the worker's statements, that they change the runs in the order of their arrays (sorted
by run id: two windows that share runs lock them in the same order).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox import delivery, operations, runs
from tests.plans import rows_read

pytestmark = pytest.mark.django_db

HISTORY = 20_000
QUEUED = 5_000
RUNNING = 1_000
WINDOW = 64
# Rows the scans of one statement may read per run of its window (the lock's, the join's,
# the unnest's: a handful each), whatever the backlog.
ROWS_PER_RUN = 10


def insert_runs(count: int, status: str, holder: str = "", lease: str = "NULL") -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            f"""
            INSERT INTO task_runs (run_id, task, queue, event, status, receive_count,
                                   last_error, correlation_id, updated_at, lease_holder,
                                   lease_expires_at)
            SELECT gen_random_uuid(), 'plans.noop', 'default', '', %s, 1, '', '',
                   clock_timestamp(), %s, {lease}
              FROM generate_series(1, %s)
            RETURNING run_id::text
            """,  # noqa: S608 (the lease's expression is the test's own)
            [status, holder, count],
        )
        return [row[0] for row in cursor.fetchall()]


@pytest.fixture
def burst():
    """A history of finished runs, analysed; then a burst of queued runs and other
    workers' running ones, which the statistics do not know of yet."""
    insert_runs(HISTORY, "succeeded")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE task_runs")
    queued = insert_runs(QUEUED, "queued")
    insert_runs(RUNNING, "running", "elsewhere", "clock_timestamp() + interval '1 hour'")
    # The window: runs from all over the backlog (one every so often).
    window = queued[:: QUEUED // WINDOW][:WINDOW]
    assert len(window) == WINDOW
    return window


def prepared_plans(sql: str, params: dict[str, tuple[str, str]]) -> list[dict]:
    """``sql``'s plans as run (in a savepoint each, rolled back), prepared with typed
    parameters as the worker's cursor prepares it, custom and generic."""
    order = list(dict.fromkeys(re.findall(r"%\((\w+)\)s", sql)))
    text = re.sub(r"%\((\w+)\)s", lambda m: f"${order.index(m.group(1)) + 1}", sql)
    types = ", ".join(params[name][0] for name in order)
    name = f"plan_{uuid.uuid4().hex[:8]}"
    plans = []
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE {name}({types}) AS {text}")
        for mode in ("force_custom_plan", "force_generic_plan"):
            with transaction.atomic():
                cursor.execute(f"SET LOCAL plan_cache_mode = {mode}")
                placeholders = ", ".join(["%s"] * len(order))
                cursor.execute(
                    f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({placeholders})",
                    [params[key][1] for key in order],
                )
                (document,) = cursor.fetchone()
                if isinstance(document, str):
                    document = json.loads(document)
                plans.append(document[0]["Plan"])
                transaction.set_rollback(True)
        cursor.execute(f"DEALLOCATE {name}")
    return plans


def statements(window: list[str]) -> dict[str, tuple[str, dict[str, tuple[str, str]]]]:
    ids = ("uuid[]", runs.uuid_array(window))
    holders = ("text[]", runs.text_array([f"me-{number}" for number in range(len(window))]))
    seconds = ("float8[]", runs.float_array([30.0] * len(window)))
    whys = ("text[]", runs.text_array(["refused"] * len(window)))
    return {
        "claim": (runs._CLAIM_MANY, {"run_ids": ids, "holders": holders, "seconds": seconds}),
        "extend": (runs._EXTEND, {"run_ids": ids, "holders": holders, "seconds": seconds}),
        "commit": (runs._SUCCEEDED_MANY, {"run_ids": ids, "holders": holders}),
        "refusal": (delivery._NOTE_REFUSAL, {"run_ids": ids, "whys": whys}),
    }


@pytest.mark.parametrize("statement", ["claim", "extend", "commit", "refusal"])
def test_a_window_statement_reads_the_window_not_the_backlog(burst, statement):
    if statement in ("extend", "commit"):
        # The window held by this worker, as after its claim.
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE task_runs SET status = 'running', lease_holder = 'me-' || ordinal - 1,"
                " lease_expires_at = clock_timestamp() + interval '1 minute'"
                "  FROM unnest(%s::uuid[]) WITH ORDINALITY AS w(run_id, ordinal)"
                " WHERE task_runs.run_id = w.run_id",
                [runs.uuid_array(burst)],
            )
    sql, params = statements(burst)[statement]
    for plan in prepared_plans(sql, params):
        indexes, read = rows_read(plan, tables_only=True)
        assert read <= ROWS_PER_RUN * WINDOW, (statement, indexes, read)
        assert "task_runs_unfinished_idx" not in indexes, (statement, indexes)
        # And it did its work: every run of the window was found and changed.
        (source,) = [node for node in plan["Plans"] if node["Parent Relationship"] == "Outer"]
        assert source["Actual Rows"] == WINDOW, (statement, source["Actual Rows"])
        if statement != "refusal":
            # One run after the other, in the order of its arrays (sorted by run id): the
            # order its rows are locked in.
            assert in_array_order(source), (statement, source)


def in_array_order(join: dict) -> bool:
    """Whether ``join`` takes its rows from ``unnest`` one after the other, each run found
    by key as it comes (a nested loop, the arrays outside, the primary key inside)."""
    if join["Node Type"] != "Nested Loop":
        return False
    sides = {node["Parent Relationship"]: node for node in join["Plans"]}
    outer, inner = sides["Outer"], sides["Inner"]
    return (
        outer["Node Type"] == "Function Scan"
        and inner["Node Type"] == "Index Scan"
        and inner["Index Name"] == "task_runs_pkey"
    )


# The transitions off the hot path: one run (or an operator's selection) among a backlog of
# runs in the very status its guard names, which the statistics do not know of yet.
BACKLOG = 5_000


def a_backlog(status: str) -> list[str]:
    insert_runs(HISTORY, "succeeded")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE task_runs")
    # Held by other workers under live leases, where a lease matters.
    lease = "clock_timestamp() + interval '1 hour'" if status == "running" else "NULL"
    return insert_runs(BACKLOG, status, "elsewhere", lease)


def hold(run_id: str, holder: str) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE task_runs SET lease_holder = %s,"
            " lease_expires_at = clock_timestamp() + interval '1 minute' WHERE run_id = %s",
            [holder, run_id],
        )


def status_of(run_ids: list[str]) -> set[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT status FROM task_runs WHERE run_id = ANY(%s::uuid[])",
            [runs.uuid_array(run_ids)],
        )
        return {row[0] for row in cursor.fetchall()}


def plan_of_last_update(move) -> dict:
    """The plan of the ``UPDATE`` that ``move`` ran, taken as run again in a savepoint
    rolled back (the move itself is kept)."""
    with CaptureQueriesContext(connection) as captured:
        move()
    (sql,) = [q["sql"] for q in captured.captured_queries if "UPDATE" in q["sql"]][-1:]
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        (document,) = cursor.fetchone()
        transaction.set_rollback(True)
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]


def test_a_retry_reads_its_run_not_the_running_backlog():
    mine = a_backlog("running")[BACKLOG // 2]
    hold(mine, "me")
    envelope = {"run_id": mine, "task": "plans.noop"}
    plan = plan_of_last_update(
        lambda: runs.RunLedger().retrying(envelope, holder="me", error="e", delay=1, rearm=False)
    )
    assert status_of([mine]) == {"retrying"}
    indexes, read = rows_read(plan, tables_only=True)
    assert read <= ROWS_PER_RUN and "task_runs_unfinished_idx" not in indexes, (indexes, read)


def test_a_give_back_reads_its_run_not_the_running_backlog():
    mine = a_backlog("running")[BACKLOG // 2]
    hold(mine, "me")
    plan = plan_of_last_update(lambda: runs.RunLedger().requeued(mine, holder="me"))
    assert status_of([mine]) == {"queued"}
    indexes, read = rows_read(plan, tables_only=True)
    assert read <= ROWS_PER_RUN and "task_runs_unfinished_idx" not in indexes, (indexes, read)


def test_a_requeue_reads_its_run_not_the_failed_backlog():
    mine = a_backlog("failed")[BACKLOG // 2]
    plan = plan_of_last_update(lambda: runs.requeue_failed_run(mine))
    assert status_of([mine]) == {"queued"}
    indexes, read = rows_read(plan, tables_only=True)
    assert read <= ROWS_PER_RUN and "task_runs_unfinished_idx" not in indexes, (indexes, read)


def test_sending_rows_again_reads_their_runs_not_the_failed_backlog():
    failed = a_backlog("failed")
    chosen = failed[:: BACKLOG // WINDOW][:WINDOW]
    plan = plan_of_last_update(lambda: operations._restart_failed_runs(chosen))
    assert status_of(chosen) == {"queued"}
    indexes, read = rows_read(plan, tables_only=True)
    assert read <= ROWS_PER_RUN * WINDOW, (indexes, read)
    assert "task_runs_unfinished_idx" not in indexes, (indexes, read)
