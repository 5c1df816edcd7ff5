"""Rows given as columns are written as ``bulk_create`` would write them, a parameter a column."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection

from common.columns import JSONArray, insert_sql
from job.models import Job
from outbox.models import Event, OutboxMessage, TaskRun, clock_timestamp
from tests.factories import AutomationFactory, TenantFactory

pytestmark = pytest.mark.django_db


def inserted_ids(sql: str, params: list) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(f"{sql} RETURNING id", params)
        return [row_id for (row_id,) in cursor.fetchall()]


def test_a_parameter_a_column_whatever_the_number_of_rows():
    tenant = TenantFactory()
    run_ids = [uuid.uuid4() for _ in range(300)]

    sql, params = insert_sql(
        OutboxMessage,
        {
            "run_id": run_ids,
            "queue": ["default"] * 300,
            "envelope": [{"n": n} for n in range(300)],
            "tenant_id": [tenant.pk] * 300,
        },
        same={"available_at": clock_timestamp()},
    )

    # A parameter a column (the queue and the tenant, the same in every row, as one value
    # each); the database's defaults left to it.
    assert len(params) == 4 and "clock_timestamp()" in sql
    assert [len(p) for p in params if isinstance(p, list)] == [300]
    assert '"attempts"' not in sql and '"created_at"' not in sql
    ids = inserted_ids(sql, params)
    rows = OutboxMessage.objects.in_bulk(ids)
    # In the arrays' order, each row its own values.
    assert [rows[row_id].run_id for row_id in ids] == run_ids
    assert [rows[row_id].envelope for row_id in ids] == [{"n": n} for n in range(300)]
    assert {row.attempts for row in rows.values()} == {0}


def test_rows_read_back_as_the_orm_writes_them_defaults_and_json_included():
    tenant = TenantFactory()
    payloads = [{"text": 'é ☃ "quoted" \\ back', "none": None, "list": [1, 2.5]}, {}]
    bodies = ['{"a":1}', '{"b":"\\u00e9"}']

    sql, params = insert_sql(
        Event,
        {
            "type": ["JobCreated", "JobStarted"],
            "aggregate_type": ["Job", "Job"],
            "aggregate_id": ["1", "2"],
            "tenant_id": [tenant.pk, None],
            "actor": ["system", "user:3"],
            "payload": payloads,
        },
    )
    by_objects = inserted_ids(sql, params)
    sql, params = insert_sql(
        Event,
        {
            "type": ["JobCreated", "JobCreated"],
            "aggregate_type": ["Job", "Job"],
            "aggregate_id": ["3", "4"],
            "tenant_id": [tenant.pk, tenant.pk],
            "actor": ["system", "system"],
            "payload": JSONArray.of_texts(bodies),
        },
        same={"correlation_id": "c-1"},
    )
    by_texts = inserted_ids(sql, params)

    events = Event.objects.in_bulk(by_objects + by_texts)
    assert [events[i].payload for i in by_objects] == payloads
    assert [events[i].payload for i in by_texts] == [{"a": 1}, {"b": "é"}]
    assert [events[i].tenant_id for i in by_objects] == [tenant.pk, None]
    assert [events[i].correlation_id for i in by_objects] == ["", ""]  # the field's default
    assert [events[i].correlation_id for i in by_texts] == ["c-1", "c-1"]
    assert all(event.occurred_at is not None for event in events.values())  # db_default


def test_none_in_a_json_column_is_sql_null_as_for_the_orm():
    tenant = TenantFactory()
    automation = AutomationFactory()
    sql, params = insert_sql(
        Job,
        {
            "tenant_id": [tenant.pk, tenant.pk],
            "automation_id": [automation.pk, automation.pk],
            "params": [{}, {}],
            "triggered_by": [None, {"schedule": 1}],
        },
    )
    ids = inserted_ids(sql, params)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT triggered_by IS NULL, status, attempt FROM jobs WHERE id = ANY(%s) ORDER BY id",
            [ids],
        )
        assert cursor.fetchall() == [(True, "pending", 0), (False, "pending", 0)]


def test_auto_now_and_callable_defaults_are_computed_once_for_the_statement():
    tenant = TenantFactory()
    run_ids = [uuid.uuid4() for _ in range(3)]
    sql, params = insert_sql(
        TaskRun,
        {"run_id": run_ids, "task": ["webhook.deliver"] * 3, "queue": ["default"] * 3},
        same={"tenant_id": tenant.pk},
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
    runs = list(TaskRun.objects.filter(run_id__in=run_ids))
    assert len(runs) == 3
    assert len({run.updated_at for run in runs}) == 1
    assert {run.status for run in runs} == {"queued"} and {run.tenant_id for run in runs} == {
        tenant.pk
    }


def test_rows_whose_every_column_is_the_same_are_all_written():
    tenant = TenantFactory()
    sql, params = insert_sql(
        Event,
        {
            "type": ["JobCreated"] * 3,
            "aggregate_type": ["Job"] * 3,
            "aggregate_id": ["1"] * 3,
            "tenant_id": [tenant.pk] * 3,
            "actor": ["system"] * 3,
            "payload": JSONArray.of_texts(["{}"] * 3),
        },
    )
    assert len(inserted_ids(sql, params)) == 3
    # Every column the same (no JSON document to give the rows): the first one stays an
    # array, as a single row's do.
    same = uuid.uuid4()
    sql, params = insert_sql(TaskRun, {"run_id": [same, same], "task": ["a"] * 2})
    assert "unnest(%s::uuid[])" in sql and [same, same] in params
    sql, params = insert_sql(TaskRun, {"run_id": [uuid.uuid4()], "task": ["a"], "queue": ["bulk"]})
    assert sql.count("unnest(") == 3


def test_a_unique_column_left_out_or_columns_of_unequal_length_are_refused():
    with pytest.raises(ValueError, match="unique"):
        insert_sql(TaskRun, {"task": ["a"], "queue": ["default"]})
    with pytest.raises(ValueError, match="one length"):
        insert_sql(TaskRun, {"run_id": [uuid.uuid4()], "task": ["a", "b"], "queue": ["default"]})
