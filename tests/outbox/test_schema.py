"""The two outbox tables, read back from the catalog, match seed 000 exactly."""

from __future__ import annotations

import re

import pytest
from django.db import IntegrityError, connection, transaction

from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db

# (column, type, nullable, identity, default) in seed 000's order.
OUTBOX_COLUMNS = [
    ("id", "bigint", "NO", "ALWAYS", None),
    ("tenant_id", "bigint", "NO", None, None),
    ("run_id", "uuid", "NO", None, None),
    ("queue", "text", "NO", None, None),
    ("envelope", "jsonb", "NO", None, None),
    ("available_at", "timestamp with time zone", "NO", None, None),
    ("sent_at", "timestamp with time zone", "YES", None, None),
    ("attempts", "integer", "NO", None, "0"),
    ("created_at", "timestamp with time zone", "NO", None, "clock_timestamp()"),
]
PLATFORM_COLUMNS = [column for column in OUTBOX_COLUMNS if column[0] != "tenant_id"]


def constraints_of(table: str) -> dict[str, tuple[str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT conname, contype, pg_get_constraintdef(oid)
            FROM pg_constraint
            WHERE conrelid = %s::regclass
            """,
            [table],
        )
        return {name: (kind, definition) for name, kind, definition in cursor.fetchall()}


def normalized(definition: str) -> str:
    """PostgreSQL prints casts and ANY(ARRAY[...]); reduce both sides to one spelling."""
    text = re.sub(r"::text(\[\])?", "", definition)
    text = re.sub(
        r"(\w+) = ANY \(ARRAY\[(.*?)\]\)", lambda m: f"{m.group(1)} IN ({m.group(2)})", text
    )
    return re.sub(r"[\s()]", "", text)


def expected_constraints(table: str) -> dict[str, tuple[str, str]]:
    return {
        f"{table}_attempts_check": ("c", "CHECK ((attempts >= 0))"),
        f"{table}_envelope_check": ("c", "CHECK ((jsonb_typeof(envelope) = 'object'))"),
        f"{table}_queue_check": (
            "c",
            "CHECK ((queue IN ('critical', 'default', 'bulk', 'maintenance')))",
        ),
        f"{table}_pkey": ("p", "PRIMARY KEY (id)"),
        f"{table}_run_id_key": ("u", "UNIQUE (run_id)"),
    }


@pytest.mark.parametrize(
    ("table", "columns"),
    [("outbox_messages", OUTBOX_COLUMNS), ("platform_outbox_messages", PLATFORM_COLUMNS)],
)
def test_columns_match_seed_000(table, columns):
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT column_name, data_type, is_nullable, identity_generation, column_default
            FROM information_schema.columns
            WHERE table_name = %s ORDER BY ordinal_position
            """,
            [table],
        )
        assert cursor.fetchall() == columns


@pytest.mark.parametrize("table", ["outbox_messages", "platform_outbox_messages"])
def test_constraints_match_seed_000(table):
    found = constraints_of(table)
    for name, (kind, definition) in expected_constraints(table).items():
        assert name in found, f"missing constraint {name}"
        assert found[name][0] == kind
        assert normalized(found[name][1]) == normalized(definition)
    extra = {name for name, (kind, _) in found.items() if kind in "cpu"} - set(
        expected_constraints(table)
    )
    assert not extra, f"constraints the seed does not define: {extra}"


def test_outbox_messages_tenant_references_tenants():
    (definition,) = [d for kind, d in constraints_of("outbox_messages").values() if kind == "f"]
    assert re.fullmatch(r"FOREIGN KEY \(tenant_id\) REFERENCES tenants\(id\).*", definition)
    assert not [
        kind for kind, _ in constraints_of("platform_outbox_messages").values() if kind == "f"
    ]


def insert(table: str, tenant_id: int | None, **overrides) -> None:
    values = {
        "run_id": "gen_random_uuid()",
        "queue": "'default'",
        "envelope": "'{}'::jsonb",
        "available_at": "now()",
        "attempts": "0",
    }
    values.update(overrides)
    if tenant_id is not None:
        values["tenant_id"] = str(tenant_id)
    columns = ", ".join(values)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"INSERT INTO {table} ({columns}) VALUES ({', '.join(values.values())})")  # noqa: S608


@pytest.mark.parametrize("table", ["outbox_messages", "platform_outbox_messages"])
@pytest.mark.parametrize(
    ("override", "constraint"),
    [
        ({"attempts": "-1"}, "attempts_check"),
        ({"envelope": "'[1, 2]'::jsonb"}, "envelope_check"),
        ({"envelope": "'\"text\"'::jsonb"}, "envelope_check"),
        ({"queue": "'urgent'"}, "queue_check"),
    ],
)
def test_each_check_rejects_a_bad_raw_insert_naming_the_constraint(table, override, constraint):
    tenant_id = TenantFactory().id if table == "outbox_messages" else None
    insert(table, tenant_id)  # the good row is accepted
    with pytest.raises(IntegrityError, match=f"{table}_{constraint}"):
        insert(table, tenant_id, **override)


@pytest.mark.parametrize("table", ["outbox_messages", "platform_outbox_messages"])
def test_run_id_is_unique_and_id_cannot_be_written(table):
    tenant_id = TenantFactory().id if table == "outbox_messages" else None
    insert(table, tenant_id, run_id="'6f1c2a8e-0000-4000-8000-000000000001'")
    with pytest.raises(IntegrityError, match=f"{table}_run_id_key"):
        insert(table, tenant_id, run_id="'6f1c2a8e-0000-4000-8000-000000000001'")
    with pytest.raises(Exception, match="GENERATED ALWAYS"):
        insert(table, tenant_id, id="12345")
