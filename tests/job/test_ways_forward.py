"""The jobs' state machine has a way forward in every state, even when what a job belongs
to ends: deactivating its automation or tenant cancels it (the ``job.cancel_deactivated``
task, subscribed to the deactivations), and the monitor's check cancels any that slipped
past that (a job created as its automation was being deactivated)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from automation.services import automation_deactivate
from common.ways_forward import stranded_checks
from identity.services import tenant_deactivate
from job.models import FINISHED, WAYS_FORWARD, Job, JobStatus
from job.monitor import job_settle_lost
from job.services import DEACTIVATED_AUTOMATION, DEACTIVATED_TENANT
from outbox.handlers import TaskMessage
from outbox.models import Event, PlatformOutboxMessage
from tests.factories import (
    AutomationWithWorkerFactory,
    JobFactory,
    PlatformAdminFactory,
    RunningJobFactory,
    TenantFactory,
)
from tests.job.support import events_of
from tests.monitor.conftest import monitor  # noqa: F401 (fixture)
from tests.observability.conftest import sample

pytestmark = pytest.mark.django_db

CANCEL_TASK = "job.cancel_deactivated"


def run_cancel_tasks() -> int:
    """Do what the background worker does with the job.cancel_deactivated rows the outbox
    holds: call their handler. Returns how many ran."""
    from job.tasks import cancel_deactivated

    rows = list(PlatformOutboxMessage.objects.filter(envelope__task=CANCEL_TASK).order_by("id"))
    for row in rows:
        envelope = row.envelope
        cancel_deactivated(
            TaskMessage(
                run_id=uuid.UUID(envelope["run_id"]),
                task=envelope["task"],
                payload=envelope["payload"],
                tenant=envelope["tenant"],
                receive_count=1,
                event=envelope["event"],
                event_id=envelope["event_id"],
                envelope=envelope,
            )
        )
    return len(rows)


def check() -> list:
    return stranded_checks()["jobs"]()


def pending_since(seconds: float, **fields) -> Job:
    since = timezone.now() - timedelta(seconds=seconds)
    return JobFactory(created_at=since, updated_at=since, **fields)


def deactivated_automation(seconds_ago: float):
    automation = AutomationWithWorkerFactory()
    automation_deactivate(automation_id=automation.id, actor=PlatformAdminFactory())
    type(automation).objects.filter(pk=automation.pk).update(
        deactivated_at=timezone.now() - timedelta(seconds=seconds_ago)
    )
    return automation


def test_every_status_is_final_or_has_a_way_forward():
    assert set(FINISHED) | set(WAYS_FORWARD) == set(JobStatus.values)
    assert not set(FINISHED) & set(WAYS_FORWARD)


def test_deactivating_an_automation_cancels_its_pending_jobs_and_asks_its_running_ones_to_stop():
    automation = AutomationWithWorkerFactory()
    pending = [JobFactory(automation=automation) for _ in range(2)]
    running = RunningJobFactory(automation=automation)
    other = JobFactory()  # another automation's: untouched

    automation_deactivate(automation_id=automation.id, actor=PlatformAdminFactory())
    assert run_cancel_tasks() == 1

    for job in pending:
        job.refresh_from_db()
        assert job.status == Job.Status.CANCELED
        assert job.failure_reason == Job.FailureReason.CANCELED
        assert job.error == DEACTIVATED_AUTOMATION
        assert job.finished_at is not None
        assert events_of(job.id) == ["JobCanceled"]
        event = Event.objects.get(type="JobCanceled", aggregate_id=str(job.id))
        assert event.actor == "system"
        assert event.payload["was"] == "pending"
        assert event.payload["reason"] == DEACTIVATED_AUTOMATION
    running.refresh_from_db()
    assert running.status == Job.Status.RUNNING and running.cancel_requested_at is not None
    other.refresh_from_db()
    assert other.status == Job.Status.PENDING

    # Its worker can no longer report: the lease ends it, canceled rather than lost.
    Job.objects.filter(pk=running.pk).update(lease_expires_at=timezone.now())
    job_settle_lost(job_id=running.id)
    running.refresh_from_db()
    assert running.status == Job.Status.CANCELED


def test_deactivating_a_tenant_cancels_its_pending_jobs():
    tenant = TenantFactory()
    pending = JobFactory(tenant=tenant)
    running = RunningJobFactory(tenant=tenant)
    other = JobFactory()

    tenant_deactivate(tenant=tenant, actor=PlatformAdminFactory())
    assert run_cancel_tasks() == 1

    pending.refresh_from_db()
    assert (pending.status, pending.error) == (Job.Status.CANCELED, DEACTIVATED_TENANT)
    running.refresh_from_db()
    assert running.cancel_requested_at is not None
    other.refresh_from_db()
    assert other.status == Job.Status.PENDING


def test_the_task_run_again_changes_nothing():
    automation = AutomationWithWorkerFactory()
    job = JobFactory(automation=automation)
    automation_deactivate(automation_id=automation.id, actor=PlatformAdminFactory())

    run_cancel_tasks()
    run_cancel_tasks()

    assert events_of(job.id) == ["JobCanceled"]


def test_the_check_cancels_a_pending_job_of_an_automation_deactivated_long_ago(settings):
    """A job created while its automation was being deactivated: the task, run before the
    job's insert committed, did not see it, and nothing else would ever end it."""
    settings.MONITOR_PENDING_SECONDS = 180
    automation = deactivated_automation(seconds_ago=600)
    job = pending_since(300, automation=automation)

    (repaired,) = check()

    assert repaired.repaired and repaired.row == f"job {job.id}"
    assert "deactivated" in repaired.problem and "canceled" in repaired.action
    job.refresh_from_db()
    assert (job.status, job.error) == (Job.Status.CANCELED, DEACTIVATED_AUTOMATION)
    assert events_of(job.id) == ["JobCanceled"]
    assert check() == []  # moved: not found again


def test_the_check_cancels_a_pending_job_of_a_tenant_deactivated_long_ago(settings):
    settings.MONITOR_PENDING_SECONDS = 180
    tenant = TenantFactory()
    tenant_deactivate(tenant=tenant, actor=PlatformAdminFactory())
    type(tenant).objects.filter(pk=tenant.pk).update(
        deactivated_at=timezone.now() - timedelta(seconds=600)
    )
    job = pending_since(300, tenant=tenant)

    (repaired,) = check()

    job.refresh_from_db()
    assert (job.status, job.error) == (Job.Status.CANCELED, DEACTIVATED_TENANT)
    assert repaired.row == f"job {job.id}"


def test_the_check_leaves_alone_what_has_a_way_forward(settings):
    settings.MONITOR_PENDING_SECONDS = 180
    waiting = pending_since(3600)  # an active automation's: its worker takes it
    running = RunningJobFactory(automation=deactivated_automation(seconds_ago=600))
    # Deactivated a moment ago: the cancel task is on its way.
    fresh = pending_since(300, automation=deactivated_automation(seconds_ago=10))

    assert check() == []

    for job in (waiting, running, fresh):
        before = job.status
        job.refresh_from_db()
        assert job.status == before


def test_the_monitor_counts_what_the_jobs_check_repaired(settings, monitor):  # noqa: F811
    settings.MONITOR_PENDING_SECONDS = 180
    job = pending_since(300, automation=deactivated_automation(seconds_ago=600))
    before = sample("hubdommed_stranded_rows_total", machine="jobs")

    counts = monitor.run_cycle()

    assert counts.stranded.repaired["jobs"] == 1
    assert sample("hubdommed_stranded_rows_total", machine="jobs") == before + 1
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELED
    assert monitor.run_cycle().stranded.repaired["jobs"] == 0
