"""Event listeners: called by ``publish`` inside the event's transaction, undone with it."""

from __future__ import annotations

import pytest
from django.db import transaction

from outbox import listeners
from outbox.listeners import RecordedEvent, register_event_listener
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
