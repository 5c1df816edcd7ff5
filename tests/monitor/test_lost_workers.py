"""Step 2: running jobs whose worker stopped heartbeating are failed or put back."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from job.models import Job
from job.monitor import Settlement, job_settle_lost
from outbox.models import Event
from tests.factories import AutomationFactory, RunningJobFactory
from tests.job.support import events_of
from tests.monitor.conftest import tenant_power_ons


@pytest.mark.django_db
def test_a_job_whose_lease_expired_fails_with_worker_lost_and_one_event(monitor, lost):
    job = lost()

    assert monitor.settle_lost_jobs() == Counter({Settlement.FAILED: 1})

    job.refresh_from_db()
    assert job.status == Job.Status.FAILED
    assert job.failure_reason == Job.FailureReason.WORKER_LOST
    assert job.finished_at is not None and job.lease_expires_at is None
    assert "lease expired" in job.error
    assert events_of(job.id) == ["JobFailed"]
    event = Event.objects.get(type="JobFailed")
    assert event.actor == "system" and event.tenant_id == job.tenant_id
    assert event.payload["failure_reason"] == "worker_lost"
    assert event.payload["attempt"] == 1


@pytest.mark.django_db
def test_settling_again_changes_nothing(monitor, lost):
    job = lost()
    monitor.settle_lost_jobs()

    assert monitor.settle_lost_jobs() == Counter()
    assert job_settle_lost(job_id=job.id) == Settlement.SKIPPED
    assert events_of(job.id) == ["JobFailed"]


@pytest.mark.django_db
def test_a_job_whose_lease_is_still_valid_is_left_alone(monitor):
    job = RunningJobFactory(lease_expires_at=timezone.now() + timedelta(seconds=30))
    before = Job.objects.filter(pk=job.pk).values().get()

    assert monitor.settle_lost_jobs() == Counter()
    assert job_settle_lost(job_id=job.id) == Settlement.ALIVE

    assert Job.objects.filter(pk=job.pk).values().get() == before
    assert events_of(job.id) == []


@pytest.mark.django_db
def test_a_heartbeat_that_arrived_after_the_listing_wins(monitor, lost):
    job = lost()
    # Listed as expired, then the worker heartbeats before the monitor takes the row.
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() + timedelta(seconds=60))

    assert job_settle_lost(job_id=job.id) == Settlement.ALIVE

    assert Job.objects.get(pk=job.pk).status == Job.Status.RUNNING
    assert events_of(job.id) == []


@pytest.mark.django_db
def test_a_lost_job_goes_back_to_pending_when_the_automation_allows_another_attempt(monitor, lost):
    job = lost(automation=AutomationFactory(max_attempts=2))

    assert monitor.settle_lost_jobs() == Counter({Settlement.REQUEUED: 1})

    job.refresh_from_db()
    assert job.status == Job.Status.PENDING and job.attempt == 1
    assert job.claim_token is None and job.lease_expires_at is None and job.started_at is None
    assert job.failure_reason == ""
    # No event: the next start records JobStarted with attempt 2.
    assert events_of(job.id) == []
    # Its machine is powered on again, on the job's tenant's outbox.
    assert tenant_power_ons() == [job.automation_id]


@pytest.mark.django_db
def test_the_last_allowed_attempt_fails_with_worker_lost(monitor, lost):
    job = lost(automation=AutomationFactory(max_attempts=2), attempt=2)

    assert monitor.settle_lost_jobs() == Counter({Settlement.FAILED: 1})

    job.refresh_from_db()
    assert job.failure_reason == Job.FailureReason.WORKER_LOST
    assert tenant_power_ons() == []


@pytest.mark.django_db
def test_a_lost_job_someone_asked_to_cancel_ends_canceled_not_retried(monitor, lost):
    job = lost(automation=AutomationFactory(max_attempts=3), cancel_requested_at=timezone.now())

    assert monitor.settle_lost_jobs() == Counter({Settlement.CANCELED: 1})

    job.refresh_from_db()
    assert job.status == Job.Status.CANCELED
    assert events_of(job.id) == ["JobCanceled"]


@pytest.mark.django_db
def test_a_lost_job_of_a_deactivated_automation_is_not_retried(monitor, lost):
    job = lost(automation=AutomationFactory(max_attempts=3, is_active=False))

    assert monitor.settle_lost_jobs() == Counter({Settlement.FAILED: 1})
    assert Job.objects.get(pk=job.pk).failure_reason == Job.FailureReason.WORKER_LOST


@pytest.mark.django_db
def test_the_lost_workers_late_report_is_refused(monitor, lost, worker_api, worker):
    job = lost(automation=worker.automation, attempt=2)
    monitor.settle_lost_jobs()

    response = worker_api.post(
        f"/api/v1/jobs/{job.id}/complete", {"claim_token": str(job.claim_token)}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED


@pytest.mark.django_db
def test_a_requeued_jobs_old_claim_is_stale(monitor, lost, worker_api, worker):
    job = lost(automation=worker.automation, attempt=1)
    assert monitor.settle_lost_jobs() == Counter({Settlement.REQUEUED: 1})

    response = worker_api.post(
        f"/api/v1/jobs/{job.id}/heartbeat", {"claim_token": str(job.claim_token)}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_claim"


@pytest.mark.django_db(transaction=True)
def test_two_monitors_at_once_settle_each_lost_job_exactly_once(lost):
    from job.management.commands.watch_stuck_jobs import Command

    retried = AutomationFactory(max_attempts=2)
    jobs = [lost() for _ in range(12)] + [lost(automation=retried) for _ in range(12)]
    start = threading.Barrier(3)
    results: list[Counter] = []

    def monitor():
        try:
            start.wait()
            results.append(Command().settle_lost_jobs())
        finally:
            connection.close()

    threads = [threading.Thread(target=monitor) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    total = sum(results, Counter())
    assert total[Settlement.FAILED] == 12 and total[Settlement.REQUEUED] == 12
    for job in jobs:
        job.refresh_from_db()
    assert Counter(job.status for job in jobs) == {"failed": 12, "pending": 12}
    assert Event.objects.filter(type="JobFailed").count() == 12
    assert sorted(tenant_power_ons()) == [retried.id] * 12


@pytest.mark.django_db
def test_a_requeued_job_is_claimed_again_as_its_next_attempt(monitor, lost, worker_api, worker):
    job = lost(automation=worker.automation, attempt=1)
    monitor.settle_lost_jobs()

    response = worker_api.post(f"/api/v1/jobs/{job.id}/start")

    assert response.status_code == 200, response.json()
    assert response.json()["attempt"] == 2
    assert events_of(job.id) == ["JobStarted"]
    assert Event.objects.get(type="JobStarted").payload["attempt"] == 2
