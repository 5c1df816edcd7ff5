"""What PostgreSQL did for a query: its plan as run (``EXPLAIN ANALYZE``), the indexes it
scanned and the rows those scans read, for the tests that hold a list to its indexes."""

from __future__ import annotations

import json

from django.db import connection


def plan_of(queryset) -> dict:
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", params)
        (document,) = cursor.fetchone()
    if isinstance(document, str):
        document = json.loads(document)
    return document[0]["Plan"]


def nodes(plan: dict):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def rows_read(plan: dict, *, tables_only: bool = False) -> tuple[set[str], int]:
    """The indexes scanned, and the rows the scans read (kept or thrown away); with
    ``tables_only``, the scans of tables and indexes alone (not of a function's or a CTE's
    rows, which a join may scan again for each of its rows)."""
    scans = [node for node in nodes(plan) if node["Node Type"].endswith("Scan")]
    if tables_only:
        scans = [node for node in scans if "Relation Name" in node or "Index Name" in node]
    indexes = {node["Index Name"] for node in scans if "Index Name" in node}
    read = sum(
        node["Actual Rows"] * node["Actual Loops"]
        + node.get("Rows Removed by Filter", 0)
        + node.get("Rows Removed by Index Recheck", 0)
        for node in scans
    )
    return indexes, read
