"""Canceling: POST /api/v1/jobs/{id}/cancel."""

from __future__ import annotations

import pytest

from job.models import Job
from outbox.models import Event
from tests.clients import client_of
from tests.factories import JobFactory, RunningJobFactory
from tests.job.support import events_of

pytestmark = pytest.mark.django_db


def cancel(client, job):
    return client.post(f"/api/v1/jobs/{job.id}/cancel")


def test_a_pending_job_is_canceled_at_once(person_client, user):
    job = JobFactory(tenant=user.tenant)

    response = cancel(person_client, job)

    assert response.status_code == 200
    assert response.json()["status"] == "canceled"
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELED and job.finished_at is not None
    assert events_of(job.id) == ["JobCanceled"]
    event = Event.objects.get(type="JobCanceled")
    assert event.actor == f"user:{user.id}" and event.payload["was"] == "pending"


def test_a_running_job_is_only_marked_for_cancellation(person_client, user):
    job = RunningJobFactory(tenant=user.tenant)

    response = cancel(person_client, job)

    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "running" and body["cancel_requested"] is True
    assert events_of(job.id) == []


def test_a_canceled_running_job_ends_canceled_when_its_worker_stops(user, worker, worker_api):
    job = RunningJobFactory(tenant=user.tenant, automation=worker.automation)
    cancel(client_of(user), job)

    response = worker_api.post(
        f"/api/v1/jobs/{job.id}/fail",
        {"claim_token": str(job.claim_token), "error": "stopped on request"},
        format="json",
    )

    assert response.status_code == 200
    job.refresh_from_db()
    assert job.status == Job.Status.CANCELED
    assert job.failure_reason == Job.FailureReason.CANCELED
    assert events_of(job.id) == ["JobCanceled"]


def test_a_canceled_running_job_that_completes_anyway_succeeds(user, worker, worker_api):
    job = RunningJobFactory(tenant=user.tenant, automation=worker.automation)
    cancel(client_of(user), job)

    worker_api.post(
        f"/api/v1/jobs/{job.id}/complete", {"claim_token": str(job.claim_token)}, format="json"
    )

    job.refresh_from_db()
    assert job.status == Job.Status.SUCCEEDED
    assert events_of(job.id) == ["JobCompleted"]


def test_canceling_twice_changes_nothing_the_second_time(person_client, user):
    pending = JobFactory(tenant=user.tenant)
    running = RunningJobFactory(tenant=user.tenant)
    for job in (pending, running):
        cancel(person_client, job)
    marked_at = Job.objects.get(pk=running.id).cancel_requested_at

    assert cancel(person_client, pending).status_code == 200
    assert cancel(person_client, running).status_code == 200

    assert events_of(pending.id) == ["JobCanceled"]
    assert events_of(running.id) == []
    assert Job.objects.get(pk=running.id).cancel_requested_at == marked_at


@pytest.mark.parametrize("status", ["succeeded", "failed"])
def test_a_finished_job_cannot_be_canceled(person_client, user, status):
    job = JobFactory(tenant=user.tenant, status=status)

    response = cancel(person_client, job)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
    assert Job.objects.get(pk=job.id).status == status
    assert events_of(job.id) == []


def test_a_canceled_job_cannot_be_claimed(person_client, user, worker, worker_api):
    job = JobFactory(tenant=user.tenant, automation=worker.automation)
    cancel(person_client, job)

    response = worker_api.post(f"/api/v1/jobs/{job.id}/start")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_pending"


def test_a_tenant_cannot_cancel_another_tenants_job(person_client, other_tenant):
    job = JobFactory(tenant=other_tenant)

    response = cancel(person_client, job)

    assert response.status_code == 404
    assert Job.objects.get(pk=job.id).status == Job.Status.PENDING
    assert events_of(job.id) == []


def test_workers_cannot_cancel(worker, worker_api):
    job = JobFactory(automation=worker.automation)

    assert cancel(worker_api, job).status_code == 401
