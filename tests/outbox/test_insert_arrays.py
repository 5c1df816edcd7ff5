"""Many rows of the outbox go as one array per column, and read back as the compiler's
INSERT would have written them."""

from __future__ import annotations

import uuid

import pytest
from django.db import connection, transaction

from outbox.models import OutboxMessage, TaskRun, clock_timestamp
from outbox.services import _insert_sql, dispatch_many
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


def runs(count: int, tenant) -> list[TaskRun]:
    return [
        TaskRun(run_id=uuid.uuid4(), task="webhook.deliver", tenant_id=tenant.pk)
        for _ in range(count)
    ]


def test_a_parameter_a_column_not_one_a_value():
    tenant = TenantFactory()
    sql, params = _insert_sql(TaskRun, runs(200, tenant))
    assert "unnest(" in sql
    # One array per column written, each as long as the rows; the columns left to their
    # database default (created_at, lease_holder) are not written at all.
    assert all(len(column) == 200 for column in params)
    assert len(params) < 20
    assert '"created_at"' not in sql and '"lease_holder"' not in sql


def test_the_same_expression_in_every_row_is_one_expression_and_differing_ones_fall_back():
    tenant = TenantFactory()
    same = [
        OutboxMessage(
            run_id=uuid.uuid4(), queue="default", envelope={"n": n}, available_at=clock_timestamp()
        )
        for n in range(3)
    ]
    sql, _ = _insert_sql(OutboxMessage, same)
    assert "clock_timestamp()" in sql and "unnest(" in sql
    differing = [
        OutboxMessage(
            run_id=uuid.uuid4(), queue="default", envelope={}, available_at=clock_timestamp()
        ),
        OutboxMessage(
            run_id=uuid.uuid4(), queue="default", envelope={}, available_at=tenant.created_at
        ),
    ]
    sql, _ = _insert_sql(OutboxMessage, differing)
    assert "unnest(" not in sql and " VALUES " in sql


def test_rows_written_as_arrays_read_back_as_one_by_one():
    tenant = TenantFactory()
    payloads = [{"delivery_id": n, "text": 'é ☃ "quoted"', "none": None} for n in range(50)]
    with transaction.atomic():
        many = dispatch_many("webhook.deliver", payloads, tenant=tenant)
        one = dispatch_many("webhook.deliver", [payloads[7]], tenant=tenant)
    rows = {row.run_id: row for row in OutboxMessage.objects.filter(tenant=tenant)}
    assert rows[many[7]].envelope["payload"] == rows[one[0]].envelope["payload"] == payloads[7]
    assert [rows[r].envelope["payload"]["delivery_id"] for r in many] == list(range(50))
    with connection.cursor() as cursor:
        cursor.execute(
            # clock_timestamp(), not now(): the test's transaction began before the rows.
            "SELECT count(*) FROM outbox_messages WHERE tenant_id = %s AND available_at "
            "BETWEEN created_at - interval '1 second' AND clock_timestamp() + interval '1 second'",
            [tenant.pk],
        )
        assert cursor.fetchone()[0] == 51
    assert set(TaskRun.objects.filter(run_id__in=many).values_list("status", flat=True)) == {
        "queued"
    }
