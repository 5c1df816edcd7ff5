"""The bulk forms of the write path: what many ``dispatch`` / ``publish`` calls would write,
in a few statements for all of them."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox import listeners
from outbox.listeners import RecordedEvent, register_event_listener
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.services import (
    EnvelopeTooLarge,
    InvalidPayload,
    NotInTransaction,
    Occurrence,
    dispatch_many,
    publish,
    publish_many,
)
from tests.factories import TenantFactory
from tests.outbox.support import counts

pytestmark = pytest.mark.django_db(transaction=True)


def _created(job_id: int, tenant, automation_id: int = 3) -> Occurrence:
    return Occurrence(
        "JobCreated",
        {"job_id": job_id, "automation_id": automation_id},
        aggregate=("Job", job_id),
        tenant=tenant,
    )


def test_dispatch_many_writes_one_run_per_payload_in_one_statement(redis_conn, settings):
    tenant = TenantFactory()
    redis_conn.delete(settings.OUTBOX_WAKE_KEY)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as queries:
            run_ids = dispatch_many(
                "webhook.deliver", [{"delivery_id": n} for n in range(30)], tenant=tenant
            )
        assert len(queries) == 1
        assert redis_conn.llen(settings.OUTBOX_WAKE_KEY) == 0, "signalled before the commit"
    # One wake for the whole transaction, after its commit.
    assert redis_conn.llen(settings.OUTBOX_WAKE_KEY) == 1

    rows = {row.run_id: row for row in OutboxMessage.objects.filter(tenant=tenant)}
    assert list(rows) != [] and set(rows) == set(run_ids) and len(run_ids) == 30
    assert [rows[run_id].envelope["payload"]["delivery_id"] for run_id in run_ids] == list(
        range(30)
    )
    assert TaskRun.objects.filter(run_id__in=run_ids, status="queued").count() == 30


def test_dispatch_many_takes_a_delay_as_available_at_by_the_database_clock():
    with transaction.atomic():
        (now_run,) = dispatch_many("maintenance.purge", [{}])
        later = dispatch_many("maintenance.purge", [{}, {}], delay=timedelta(hours=2))
    now_row = PlatformOutboxMessage.objects.get(run_id=now_run)
    for run_id in later:
        gap = PlatformOutboxMessage.objects.get(run_id=run_id).available_at - now_row.available_at
        assert timedelta(hours=2) <= gap < timedelta(hours=2, seconds=5)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda: dispatch_many("maintenance.purge", [{}, {"x": float("nan")}]), InvalidPayload),
        (
            lambda: dispatch_many("maintenance.purge", [{}, {"blob": "x" * (256 * 1024)}]),
            EnvelopeTooLarge,
        ),
        (lambda: dispatch_many("maintenance.purge", [{}], delay=-1), Exception),
        (
            lambda: publish_many(
                [
                    _created(1, None),
                    Occurrence("JobCreated", {"job_id": 2}, aggregate=("Job", 2)),
                ]
            ),
            InvalidPayload,  # the automation's queue needs automation_id
        ),
    ],
)
def test_one_bad_item_refuses_the_call_and_writes_nothing(call, error):
    with transaction.atomic(), pytest.raises(error):
        call()
    assert counts() == (0, 0, 0, 0)


def test_the_bulk_forms_are_refused_outside_a_transaction():
    with pytest.raises(NotInTransaction):
        dispatch_many("maintenance.purge", [{}])
    with pytest.raises(NotInTransaction):
        publish_many([_created(1, None)])
    assert counts() == (0, 0, 0, 0)


def test_publish_many_records_each_event_and_one_run_per_subscriber(heard):
    tenants = [TenantFactory(), TenantFactory()]
    with transaction.atomic():
        published = publish_many(_created(n, tenants[n % 2]) for n in range(10))

    assert len(published) == 10
    events = {event.pk: event for event in Event.objects.all()}
    assert set(events) == {p.event_id for p in published}
    for n, item in enumerate(published):
        event = events[item.event_id]
        assert (event.type, event.aggregate_id, event.tenant_id) == (
            "JobCreated",
            str(n),
            tenants[n % 2].pk,
        )
        messages = OutboxMessage.objects.filter(run_id__in=item.run_ids)
        # JobCreated's subscribers: one row each, naming the event by its id.
        assert sorted(m.envelope["task"] for m in messages) == [
            "machines.power_on",
            "worker.job_available",
        ]
        assert all(m.envelope["event_id"] == event.pk for m in messages)
        assert all(m.tenant_id == event.tenant_id for m in messages)
    # The automation's own worker settles nothing: one task run per event, not two.
    assert TaskRun.objects.count() == 10
    # Each event heard by the listeners, as publish tells them.
    assert [e.id for e in heard] == [p.event_id for p in published]
    assert all(e.occurred_at is not None for e in heard)


def test_publish_many_takes_as_many_statements_for_ten_events_as_for_two_hundred(monkeypatch):
    monkeypatch.setattr(listeners, "_listeners", {})
    tenant = TenantFactory()
    statements = []
    for size in (10, 200):
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            publish_many(_created(n, tenant) for n in range(size))
        statements.append(len(queries))
    assert statements == [2, 2]
    assert Event.objects.count() == 210 and OutboxMessage.objects.count() == 420


def test_a_failing_listener_undoes_every_event_of_the_call(monkeypatch):
    monkeypatch.setattr(listeners, "_listeners", {})
    tenant = TenantFactory()

    def refuse_the_third(event: RecordedEvent) -> None:
        if event.aggregate_id == "2":
            raise RuntimeError("no")

    register_event_listener("test.refuse", refuse_the_third)
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            publish_many(_created(n, tenant) for n in range(5))
        dispatch_many("maintenance.purge", [{}])  # the caller carries on, and commits

    assert counts() == (0, 1, 1, 0)


def test_an_envelope_over_the_limit_with_its_event_id_is_refused_before_any_write(settings):
    tenant = TenantFactory()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 99999)")
    with transaction.atomic():
        (first,) = publish_many([_created(7, tenant)])
    envelope = OutboxMessage.objects.filter(envelope__event_id=first.event_id).first().envelope
    assert first.event_id == 100000
    settings.OUTBOX_MAX_ENVELOPE_BYTES = len(json.dumps(envelope, separators=(",", ":")).encode())

    with transaction.atomic():
        with pytest.raises(EnvelopeTooLarge):
            # Seven digits from 1,000,000 on: one byte over.
            with connection.cursor() as cursor:
                cursor.execute("SELECT setval(pg_get_serial_sequence('events', 'id'), 999999)")
            publish_many([_created(7, tenant), _created(8, tenant)])
        dispatch_many("maintenance.purge", [{}])

    assert list(Event.objects.values_list("aggregate_id", flat=True)) == ["7"]
    assert counts() == (2, 1, 2, 1)


def test_a_listener_with_a_batch_form_hears_the_events_of_one_call_together(monkeypatch):
    monkeypatch.setattr(listeners, "_listeners", {})
    monkeypatch.setattr(listeners, "_batch_listeners", {})
    tenant = TenantFactory()
    one_by_one: list[RecordedEvent] = []
    together: list[list[RecordedEvent]] = []
    register_event_listener("test.batch", one_by_one.append, batch=together.append)

    with transaction.atomic():
        published = publish_many(_created(n, tenant) for n in range(4))

    assert one_by_one == []
    assert [[event.id for event in events] for events in together] == [
        [p.event_id for p in published]
    ]


def test_publish_many_writes_the_very_rows_publish_writes(monkeypatch):
    monkeypatch.setattr(listeners, "_listeners", {})
    tenant = TenantFactory()
    occurrences = [
        _created(5, tenant),
        # A platform event (no tenant): its rows go to the platform's outbox.
        Occurrence("AutomationCreated", {"automation_id": 9, "name": 'é "q"'}, aggregate=("A", 9)),
    ]
    with transaction.atomic():
        one_by_one = [
            publish(o.event, o.payload, tenant=o.tenant, aggregate=o.aggregate) for o in occurrences
        ]
    with transaction.atomic():
        many = publish_many(occurrences)

    def rows(published) -> list:
        event = Event.objects.get(pk=published.event_id)
        found = [
            (event.type, event.aggregate_type, event.aggregate_id, event.tenant_id, event.actor),
            (event.payload, event.correlation_id != ""),
        ]
        for model in (OutboxMessage, PlatformOutboxMessage):
            for message in model.objects.filter(run_id__in=published.run_ids).order_by("id"):
                envelope = dict(message.envelope)
                # Each run its own id, each event its own; the rest is the same.
                assert envelope.pop("run_id") == str(message.run_id)
                assert envelope.pop("event_id") == event.pk
                envelope.pop("occurred_at"), envelope.pop("correlation_id")
                found.append((model.__name__, message.queue, envelope, message.attempts))
                assert message.available_at <= message.created_at + timedelta(seconds=1)
        for run in TaskRun.objects.filter(run_id__in=published.run_ids).order_by("task"):
            found.append((run.task, run.queue, run.event, run.tenant_id, run.status))
        return found

    for alone, together in zip(one_by_one, many, strict=True):
        assert len(alone.run_ids) == len(together.run_ids)
        assert rows(together) == rows(alone)
