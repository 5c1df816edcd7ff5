"""publish_new: a new row and the event about it, written in one statement or not at all."""

from __future__ import annotations

import json

import pytest
from django.db import IntegrityError, connection, transaction
from django.test.utils import CaptureQueriesContext

from job.models import Job
from outbox import listeners
from outbox.listeners import RecordedEvent, register_event_listener
from outbox.models import Event, OutboxMessage, TaskRun
from outbox.services import EnvelopeTooLarge, NotInTransaction, OutboxError, dispatch, publish_new
from tests.factories import AutomationFactory, TenantFactory
from tests.outbox.support import counts

pytestmark = pytest.mark.django_db(transaction=True)


def new_job(tenant, automation, **fields) -> Job:
    return Job(tenant=tenant, automation=automation, params={"invoice": 7}, **fields)


def created(job: Job) -> dict:
    return {"job_id": job.pk, "automation_id": job.automation_id, "tenant_id": job.tenant_id}


def test_the_row_its_event_runs_and_outbox_rows_are_one_statement_each_naming_the_row():
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)

    with CaptureQueriesContext(connection) as captured, transaction.atomic():
        published = publish_new(
            "JobCreated", created(job), row=job, id_key="job_id", tenant=tenant, actor="user:3"
        )

    writes = [query["sql"] for query in captured.captured_queries if "INSERT" in query["sql"]]
    assert len(writes) == 1
    assert job.pk is not None and not job._state.adding
    assert Job.objects.get().pk == job.pk
    event = Event.objects.get()
    assert event.pk == published.event_id
    assert (event.aggregate_type, event.aggregate_id) == ("Job", str(job.pk))
    assert event.payload == {
        "job_id": job.pk,
        "automation_id": automation.pk,
        "tenant_id": tenant.pk,
    }
    messages = list(OutboxMessage.objects.order_by("id"))
    assert [message.run_id for message in messages] == list(published.run_ids)
    for message in messages:
        assert message.envelope["event_id"] == event.pk
        assert message.envelope["payload"] == event.payload
    assert TaskRun.objects.count() == 1  # the automation's own worker settles no run


def test_the_listeners_hear_the_event_with_the_rows_id(heard):
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)

    with transaction.atomic():
        publish_new("JobCreated", created(job), row=job, id_key="job_id", tenant=tenant)

    (event,) = heard
    assert event.aggregate_id == str(job.pk)
    assert event.payload["job_id"] == job.pk


def test_a_row_its_table_refuses_writes_no_event_and_no_outbox_rows():
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)
    job.params = ["not", "an", "object"]  # jobs_params_check

    with pytest.raises(IntegrityError), transaction.atomic():
        publish_new("JobCreated", created(job), row=job, id_key="job_id", tenant=tenant)

    assert job.pk is None
    assert Job.objects.count() == 0
    assert counts() == (0, 0, 0, 0)


def test_an_envelope_pushed_over_the_limit_by_the_rows_id_leaves_nothing(settings):
    """Both ids are known only once written: the row's and the event's digits may push an
    envelope over the limit, and then the row goes with the event's rows."""
    tenant, automation = TenantFactory(), AutomationFactory()
    with connection.cursor() as cursor:
        cursor.execute("SELECT setval(pg_get_serial_sequence('jobs', 'id'), 99999)")
    first = new_job(tenant, automation)
    with transaction.atomic():
        publish_new("JobCreated", created(first), row=first, id_key="job_id", tenant=tenant)
    envelope = OutboxMessage.objects.filter(envelope__task="machines.power_on").get().envelope
    size = len(json.dumps(envelope, separators=(",", ":")).encode())
    assert first.pk == 100000  # six digits, and so is the next one
    # One byte short for the next six-digit id; enough for the one-digit id checked before.
    settings.OUTBOX_MAX_ENVELOPE_BYTES = size - 1

    second = new_job(tenant, automation)
    with transaction.atomic():
        with pytest.raises(EnvelopeTooLarge):
            publish_new("JobCreated", created(second), row=second, id_key="job_id", tenant=tenant)
        dispatch("maintenance.purge", {})  # the caller carries on, and commits

    assert second.pk is None
    assert list(Job.objects.values_list("pk", flat=True)) == [first.pk]
    assert list(Event.objects.values_list("aggregate_id", flat=True)) == [str(first.pk)]
    assert counts() == (2, 1, 2, 1)


def test_a_failing_listener_undoes_the_row_too(monkeypatch):
    monkeypatch.setattr(listeners, "_listeners", {})

    def refuse(event: RecordedEvent) -> None:
        raise RuntimeError("no")

    register_event_listener("test.refuse", refuse)
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)
    with transaction.atomic():
        with pytest.raises(RuntimeError):
            publish_new("JobCreated", created(job), row=job, id_key="job_id", tenant=tenant)
        assert not Job.objects.exists()
        assert counts() == (0, 0, 0, 0)


@pytest.mark.parametrize("id_key", ["job id", "job_id}'", ""])
def test_an_id_key_that_is_not_a_plain_key_is_refused(id_key):
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)
    with pytest.raises(OutboxError), transaction.atomic():
        publish_new("JobCreated", created(job), row=job, id_key=id_key, tenant=tenant)
    assert Job.objects.count() == 0


def test_calling_outside_a_transaction_is_refused_and_writes_nothing():
    tenant, automation = TenantFactory(), AutomationFactory()
    job = new_job(tenant, automation)
    with pytest.raises(NotInTransaction):
        publish_new("JobCreated", created(job), row=job, id_key="job_id", tenant=tenant)
    assert Job.objects.count() == 0
