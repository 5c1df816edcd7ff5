"""maintenance.purge deletes outbox rows sent more than 7 days ago, and nothing else."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from outbox.handlers import TaskMessage
from outbox.models import OutboxMessage, PlatformOutboxMessage
from outbox.tasks import outbox_purge
from worker.registry import discover_handlers

pytestmark = pytest.mark.django_db


def _row(model, *, sent_days_ago: float | None, created_days_ago: float = 30, **extra):
    now = timezone.now()
    run_id = uuid.uuid4()
    row = model.objects.create(
        run_id=run_id,
        queue="default",
        envelope={"run_id": str(run_id), "task": "maintenance.purge"},
        available_at=now - timedelta(days=created_days_ago),
        sent_at=None if sent_days_ago is None else now - timedelta(days=sent_days_ago),
        **extra,
    )
    return row.run_id


def _rows(tenant):
    return {
        "old sent": [
            _row(OutboxMessage, sent_days_ago=8, tenant=tenant),
            _row(OutboxMessage, sent_days_ago=20, tenant=tenant),
            _row(PlatformOutboxMessage, sent_days_ago=7.5),
            _row(PlatformOutboxMessage, sent_days_ago=9),
            _row(PlatformOutboxMessage, sent_days_ago=10),
        ],
        "recent sent": [
            _row(OutboxMessage, sent_days_ago=6, tenant=tenant),
            _row(PlatformOutboxMessage, sent_days_ago=1),
        ],
        "pending": [
            _row(OutboxMessage, sent_days_ago=None, created_days_ago=60, tenant=tenant),
            _row(PlatformOutboxMessage, sent_days_ago=None, created_days_ago=60),
        ],
    }


def _remaining() -> set[uuid.UUID]:
    return set(OutboxMessage.objects.values_list("run_id", flat=True)) | set(
        PlatformOutboxMessage.objects.values_list("run_id", flat=True)
    )


def test_purge_deletes_only_rows_sent_more_than_seven_days_ago_in_both_tables(tenant):
    rows = _rows(tenant)

    deleted = outbox_purge(batch_size=2)

    assert deleted == {"outbox_messages": 2, "platform_outbox_messages": 3}
    assert _remaining() == set(rows["recent sent"]) | set(rows["pending"])


def test_purge_never_deletes_a_pending_row_however_old(tenant):
    pending = _row(PlatformOutboxMessage, sent_days_ago=None, created_days_ago=365)

    outbox_purge()

    assert _remaining() == {pending}


def test_the_maintenance_purge_task_is_registered_and_purges(tenant):
    rows = _rows(tenant)
    handler = discover_handlers()["maintenance.purge"]

    handler(
        TaskMessage(
            run_id=uuid.uuid4(), task="maintenance.purge", payload={}, tenant=None, receive_count=1
        )
    )

    assert _remaining() == set(rows["recent sent"]) | set(rows["pending"])
