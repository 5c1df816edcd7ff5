"""Event listeners: called by ``publish`` inside the event's transaction, undone with it."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox import listeners
from outbox.listeners import Condition, RecordedEvent, register_event_listener
from outbox.models import Event
from outbox.services import publish

pytestmark = pytest.mark.django_db


def test_a_listener_hears_each_event_with_its_trail_row(heard, tenant):
    with transaction.atomic():
        published = publish("JobStarted", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))
        (event,) = heard
        # Inside the transaction: the trail row is there, visible to the listener's writes.
        assert Event.objects.filter(pk=event.id).exists()
    assert event.id == published.event_id
    assert (event.type, event.tenant_id, event.aggregate_type, event.aggregate_id) == (
        "JobStarted",
        tenant.pk,
        "Job",
        "7",
    )
    assert event.payload == {"job_id": 7}
    assert event.occurred_at is not None


def test_a_failing_listener_undoes_the_event(monkeypatch, tenant):
    monkeypatch.setattr(listeners, "_listeners", {})

    def refuse(event: RecordedEvent) -> None:
        raise RuntimeError("no")

    register_event_listener("test.refuse", refuse)
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            publish("JobStarted", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))
        assert not Event.objects.exists()


def test_an_interest_is_asked_by_the_events_own_statement(monkeypatch, tenant):
    """A listener with an interest is called only for the events its condition holds for,
    the condition evaluated by the statement that writes the event: no statement of its
    own, and it sees what the transaction wrote before."""
    monkeypatch.setattr(listeners, "_listeners", {})
    monkeypatch.setattr(listeners, "_interests", {})
    heard: list[RecordedEvent] = []
    asked: list[tuple[str, int | None]] = []

    def interest(event_type: str, tenant_id: int | None) -> Condition | None:
        asked.append((event_type, tenant_id))
        if event_type == "JobCanceled":
            return None  # nothing to do, whatever the rows say
        return Condition(
            "SELECT EXISTS (SELECT 1 FROM events WHERE type = %s AND aggregate_id = %s)",
            ("JobStarted", "7"),
        )

    register_event_listener("test.interest", heard.append, interest=interest)
    with transaction.atomic():
        with CaptureQueriesContext(connection) as first:
            # The condition reads the rows as the statement sees them: this event's own
            # row is written by it, not before it.
            publish("JobStarted", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))
        publish("JobCanceled", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))
        # Now a JobStarted of job 7 is in the trail, written by the transaction before.
        second = publish("JobCompleted", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))

    assert len(first.captured_queries) == 1
    assert [event.id for event in heard] == [second.event_id]
    assert asked == [
        ("JobStarted", tenant.pk),
        ("JobCanceled", tenant.pk),
        ("JobCompleted", tenant.pk),
    ]


def test_a_listener_without_an_interest_hears_every_event(monkeypatch, tenant):
    monkeypatch.setattr(listeners, "_listeners", {})
    monkeypatch.setattr(listeners, "_interests", {})
    heard: list[RecordedEvent] = []
    register_event_listener("test.always", heard.append)
    # Registered again with an interest, then without: the interest goes with it.
    register_event_listener("test.again", heard.append, interest=lambda *_: None)
    register_event_listener("test.again", heard.append)

    with transaction.atomic():
        publish("JobStarted", {"job_id": 7}, tenant=tenant, aggregate=("Job", 7))

    assert len(heard) == 2
