"""The outbox promise: a change and its messages commit together or not at all."""

from __future__ import annotations

import json
import uuid
from datetime import timedelta

import pytest
from django.db import connection, transaction

from outbox.catalog import UnknownEvent, UnknownTask
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.services import (
    EnvelopeTooLarge,
    InvalidPayload,
    NotInTransaction,
    dispatch,
    publish,
)
from tests.factories import TenantFactory
from tests.outbox.support import counts

pytestmark = pytest.mark.django_db(transaction=True)


class Boom(Exception):
    pass


def test_a_rollback_leaves_no_outbox_task_run_or_event_rows():
    tenant = TenantFactory()
    with pytest.raises(Boom), transaction.atomic():
        dispatch("maintenance.purge", {})
        publish(
            "JobCreated", {"automation_id": 1, "job_id": 7}, tenant=tenant, aggregate=("Job", 7)
        )
        raise Boom

    assert counts() == (0, 0, 0, 0)


def test_a_commit_leaves_exactly_the_expected_rows():
    tenant = TenantFactory()
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {"older_than_days": 7})
        published = publish(
            "JobCreated",
            {"automation_id": 5, "job_id": 9},
            tenant=tenant,
            aggregate=("Job", 9),
            actor="user:1",
        )

    # JobCreated has two subscribers (power-on and the automation's worker): tenant rows;
    # the automation's worker has no database, so its message has no task run.
    assert counts() == (2, 1, 2, 1)
    platform_row = PlatformOutboxMessage.objects.get()
    assert platform_row.run_id == run_id
    assert platform_row.queue == "maintenance"
    assert platform_row.sent_at is None and platform_row.attempts == 0
    assert platform_row.envelope["payload"] == {"older_than_days": 7}

    event = Event.objects.get()
    assert (event.type, event.aggregate_type, event.aggregate_id) == ("JobCreated", "Job", "9")
    assert event.tenant_id == tenant.id and event.actor == "user:1"
    assert event.id == published.event_id

    rows = {row.envelope["task"]: row for row in OutboxMessage.objects.all()}
    assert set(rows) == {"machines.power_on", "worker.job_available"}
    assert rows["worker.job_available"].envelope["destination"] == "automation-5"
    assert rows["machines.power_on"].envelope["destination"] == "critical"
    for row in rows.values():
        assert row.tenant_id == tenant.id
        envelope = row.envelope
        assert envelope["version"] == 1
        assert envelope["run_id"] == str(row.run_id)
        assert envelope["event"] == "JobCreated" and envelope["event_id"] == event.id
        assert envelope["tenant"] == tenant.id
        assert envelope["correlation_id"]
        assert envelope["occurred_at"]

    runs = TaskRun.objects.in_bulk(field_name="run_id")
    assert set(runs) == {run_id, rows["machines.power_on"].run_id}
    assert {run.status for run in runs.values()} == {"queued"}
    assert runs[run_id].tenant_id is None


def test_fan_out_gives_one_row_per_subscriber_each_with_its_own_run_id(settings, tmp_path):
    catalog = {
        "events": ["Ping"],
        "tasks": [
            {"name": f"listener.{n}", "queue": "default", "subscribes": ["Ping"]} for n in range(6)
        ],
    }
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(catalog))
    settings.TASKS_CATALOG = path

    with transaction.atomic():
        published = publish("Ping", {}, aggregate=("System", "1"))

    rows = list(PlatformOutboxMessage.objects.order_by("id"))
    assert len(rows) == 6
    assert len({row.run_id for row in rows}) == 6
    assert {row.run_id for row in rows} == set(published.run_ids)
    assert sorted(row.envelope["task"] for row in rows) == [f"listener.{n}" for n in range(6)]
    assert TaskRun.objects.filter(run_id__in=published.run_ids).count() == 6


def test_a_delay_moves_available_at_by_the_database_clock():
    with transaction.atomic():
        now_run = dispatch("maintenance.purge", {})
        later_run = dispatch("maintenance.purge", {}, delay=timedelta(hours=2))
    now_row = PlatformOutboxMessage.objects.get(run_id=now_run)
    later_row = PlatformOutboxMessage.objects.get(run_id=later_run)
    gap = later_row.available_at - now_row.available_at
    assert timedelta(hours=2) <= gap < timedelta(hours=2, seconds=5)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: dispatch("no.such.task", {}), UnknownTask),
        (lambda: publish("NoSuchEvent", {}, aggregate=("X", 1)), UnknownEvent),
        (lambda: dispatch("maintenance.purge", {"when": object()}), InvalidPayload),
        (lambda: dispatch("maintenance.purge", {"x": float("nan")}), InvalidPayload),
        (lambda: dispatch("maintenance.purge", ["not", "an", "object"]), InvalidPayload),
        (lambda: dispatch("maintenance.purge", {"blob": "x" * (256 * 1024)}), EnvelopeTooLarge),
        (lambda: dispatch("maintenance.purge", {}, delay=-1), Exception),
        (
            lambda: publish("JobCreated", {"job_id": 1}, tenant=None, aggregate=("Job", 1)),
            InvalidPayload,  # the automation's queue needs automation_id
        ),
    ],
)
def test_bad_calls_raise_clearly_and_write_nothing(call, error):
    with transaction.atomic(), pytest.raises(error):
        call()
    assert counts() == (0, 0, 0, 0)


def test_an_envelope_just_under_the_limit_is_accepted():
    with transaction.atomic():
        dispatch("maintenance.purge", {"blob": "x" * (255 * 1024)})
    assert PlatformOutboxMessage.objects.count() == 1


def test_calling_outside_a_transaction_is_refused_and_writes_nothing():
    assert not connection.in_atomic_block
    with pytest.raises(NotInTransaction):
        dispatch("maintenance.purge", {})
    with pytest.raises(NotInTransaction):
        publish("TenantCreated", {}, aggregate=("Tenant", 1))
    assert counts() == (0, 0, 0, 0)


def test_run_ids_are_uuids_and_unique_across_calls():
    with transaction.atomic():
        ids = [dispatch("maintenance.purge", {"n": n}) for n in range(20)]
    assert all(isinstance(run_id, uuid.UUID) for run_id in ids)
    assert len(set(ids)) == 20


def test_a_message_for_an_automation_worker_leaves_no_task_run(settings, tmp_path):
    """An automation's worker has no database: a run written for its messages would stay
    ``queued`` forever. Only the runs a database-backed worker settles are written."""
    catalog = {
        "events": ["Ping"],
        "tasks": [
            {"name": "shared.task", "queue": "critical", "subscribes": ["Ping"]},
            {
                "name": "own.task",
                "queue": "critical",
                "destination": "automation",
                "subscribes": ["Ping"],
            },
        ],
    }
    path = tmp_path / "tasks.json"
    path.write_text(json.dumps(catalog))
    settings.TASKS_CATALOG = path
    tenant = TenantFactory()

    with transaction.atomic():
        published = publish("Ping", {"automation_id": 4}, tenant=tenant, aggregate=("X", "1"))
        direct = dispatch("own.task", {"automation_id": 4}, tenant=tenant)

    rows = {row.run_id: row.envelope for row in OutboxMessage.objects.all()}
    assert set(rows) == {*published.run_ids, direct}
    assert list(TaskRun.objects.values_list("task", flat=True)) == ["shared.task"]
    assert {envelope["destination"] for envelope in rows.values()} == {
        "critical",
        "automation-4",
    }


def test_a_refused_event_caught_by_the_caller_leaves_no_trail_row_in_its_commit():
    """publish takes no savepoint: every refusal is found before it writes anything."""
    tenant = TenantFactory()
    with transaction.atomic():
        with pytest.raises(InvalidPayload):
            # JobCreated goes to the automation's own queue: it needs automation_id.
            publish("JobCreated", {"job_id": 1}, tenant=tenant, aggregate=("Job", 1))
        dispatch("maintenance.purge", {})  # the caller carries on, and commits

    assert counts() == (0, 1, 1, 0)


def test_an_envelope_pushed_over_the_limit_by_its_event_id_leaves_no_trail_row(settings):
    """The event's id is known only once its trail row is written; an envelope that its
    digits push over the limit is refused then, and the row goes with the refusal."""
    tenant = TenantFactory()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 99999)")
    payload = {"automation_id": 1, "job_id": 7}
    with transaction.atomic():
        first = publish("JobCreated", payload, tenant=tenant, aggregate=("Job", 7))
    envelope = OutboxMessage.objects.filter(envelope__event_id=first.event_id).first().envelope
    size = len(json.dumps(envelope, separators=(",", ":")).encode())
    assert first.event_id == 100000  # six digits, and so is the next one
    # One byte short for a six-digit id; plenty for the one-digit id checked beforehand.
    settings.OUTBOX_MAX_ENVELOPE_BYTES = size - 1

    with transaction.atomic():
        with pytest.raises(EnvelopeTooLarge):
            publish("JobCreated", payload, tenant=tenant, aggregate=("Job", 8))
        dispatch("maintenance.purge", {})

    assert list(Event.objects.values_list("aggregate_id", flat=True)) == ["7"]
    assert counts() == (2, 1, 2, 1)
