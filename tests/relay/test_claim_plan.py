"""The claim's plan does not depend on statistics: on a table never analysed, with 100,000
pending rows, it walks the pending index in id order and stops after its batch, instead of
reading every pending row into a sort under the row locks."""

from __future__ import annotations

import json

import pytest
from django.db import connection

from outbox.delivery import CLAIM, CLAIM_PLANNER, TABLES, TENANT_COLUMN

pytestmark = pytest.mark.django_db

PENDING = 100_000
LIMIT = 500


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def never_analysed_copy(cursor, table: str) -> tuple[str, str]:
    """A new table shaped like ``table`` (its indexes included), autovacuum off, filled
    with pending rows and never analysed: (its name, the name of its pending index)."""
    probe = f"claim_probe_{table}"
    cursor.execute(
        f"CREATE TABLE {probe} (LIKE {table} INCLUDING ALL) WITH (autovacuum_enabled = false)"
    )
    # The copy has no foreign key (LIKE leaves them out): any tenant id will do.
    tenant = ("", "") if TENANT_COLUMN[table] == "NULL" else (", tenant_id", ", 1")
    cursor.execute(
        f"""
        INSERT INTO {probe} (run_id, queue, envelope, available_at{tenant[0]})
        SELECT gen_random_uuid(), 'default',
               jsonb_build_object('task', 'maintenance.purge', 'destination', 'default',
                                  'payload', jsonb_build_object('n', n)),
               clock_timestamp() - interval '1 second'{tenant[1]}
          FROM generate_series(1, %s) AS n
        """,  # noqa: S608 (the names are the test's own)
        [PENDING],
    )
    cursor.execute(
        "SELECT c.reltuples, (SELECT count(*) FROM pg_stats WHERE tablename = %s) "
        "FROM pg_class c WHERE c.relname = %s",
        [probe, probe],
    )
    reltuples, stats = cursor.fetchone()
    assert (reltuples, stats) == (-1, 0), "the probe table must be without statistics"
    cursor.execute(
        "SELECT indexname FROM pg_indexes WHERE tablename = %s "
        "AND indexdef LIKE '%%WHERE (sent_at IS NULL)'",
        [probe],
    )
    (index,) = cursor.fetchone()
    return probe, index


@pytest.mark.parametrize("table", TABLES)
def test_the_claim_walks_the_pending_index_on_a_never_analysed_table(table):
    with connection.cursor() as cursor:
        probe, index = never_analysed_copy(cursor, table)
        cursor.execute(CLAIM_PLANNER)
        cursor.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) "
            + CLAIM.format(table=probe, tenant=TENANT_COLUMN[table]),
            [LIMIT],
        )
        raw = cursor.fetchone()[0]
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    kinds = [node["Node Type"] for node in nodes(plan)]

    assert not {"Sort", "Incremental Sort", "Bitmap Heap Scan", "Seq Scan"} & set(kinds), kinds
    (scan,) = [node for node in nodes(plan) if node["Node Type"] == "Index Scan"]
    assert scan["Index Name"] == index
    # It stopped after the batch instead of reading every pending row.
    assert scan["Actual Rows"] == LIMIT
    assert plan["Actual Rows"] == LIMIT
