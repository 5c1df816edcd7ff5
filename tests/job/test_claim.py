"""The claim: POST /api/v1/jobs/{id}/start, and the worker's poll."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from identity.tokens import issue_access_token
from job.models import Job
from outbox.models import Event
from tests.clients import client_of
from tests.factories import JobFactory, RunningJobFactory, WorkerFactory
from tests.job.support import events_of, worker_client

pytestmark = pytest.mark.django_db


def start(client, job_id):
    return client.post(f"/api/v1/jobs/{job_id}/start")


def test_a_pending_job_is_claimed_with_a_token_and_a_lease(worker_api, worker, settings):
    settings.JOB_LEASE_SECONDS = 90
    job = JobFactory(automation=worker.automation)
    before = timezone.now()

    response = start(worker_api, job.id)

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["status"] == "running"
    assert body["attempt"] == 1
    assert uuid.UUID(body["claim_token"])
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert str(job.claim_token) == body["claim_token"]
    lease = (job.lease_expires_at - job.started_at).total_seconds()
    assert lease == 90
    assert job.started_at >= before


def test_the_claim_records_job_started_once_with_the_worker_as_actor(worker_api, worker):
    job = JobFactory(automation=worker.automation)

    start(worker_api, job.id)

    assert events_of(job.id) == ["JobStarted"]
    event = Event.objects.get(type="JobStarted")
    assert event.actor == f"worker:{worker.id}"
    assert event.tenant_id == job.tenant_id
    assert event.payload["job_id"] == job.id and event.payload["attempt"] == 1


def test_the_claim_records_when_the_worker_was_last_seen(worker_api, worker):
    job = JobFactory(automation=worker.automation)

    start(worker_api, job.id)

    worker.refresh_from_db()
    assert worker.last_seen_at is not None


def test_a_claimed_job_is_refused_as_already_claimed(worker, worker_api):
    job = RunningJobFactory(automation=worker.automation)
    token = job.claim_token

    response = start(worker_api, job.id)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_claimed"
    job.refresh_from_db()
    assert job.claim_token == token and job.attempt == 1
    assert events_of(job.id) == []


def test_a_claim_sent_again_with_its_token_gets_the_same_claim(worker_api, worker, settings):
    # The worker names its claim: when the answer is lost on the way back, the same
    # request again is answered with the claim the first one made, not refused.
    settings.JOB_LEASE_SECONDS = 90
    job = JobFactory(automation=worker.automation)
    token = str(uuid.uuid4())

    first = worker_api.post(f"/api/v1/jobs/{job.id}/start", {"claim_token": token}, format="json")
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now())
    again = worker_api.post(f"/api/v1/jobs/{job.id}/start", {"claim_token": token}, format="json")

    assert (first.status_code, again.status_code) == (200, 200), again.json()
    assert first.json()["claim_token"] == again.json()["claim_token"] == token
    assert again.json()["attempt"] == 1
    job.refresh_from_db()
    assert str(job.claim_token) == token and job.attempt == 1
    # Its lease starts again from the answer the worker got.
    assert (job.lease_expires_at - timezone.now()).total_seconds() > 80
    assert events_of(job.id) == ["JobStarted"]


def test_a_claim_with_another_token_is_refused_as_already_claimed(worker_api, worker):
    job = JobFactory(automation=worker.automation)
    worker_api.post(
        f"/api/v1/jobs/{job.id}/start", {"claim_token": str(uuid.uuid4())}, format="json"
    )

    response = worker_api.post(
        f"/api/v1/jobs/{job.id}/start", {"claim_token": str(uuid.uuid4())}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_claimed"
    assert events_of(job.id) == ["JobStarted"]


def test_a_claim_token_that_is_no_uuid_is_a_400(worker_api, worker):
    job = JobFactory(automation=worker.automation)

    response = worker_api.post(
        f"/api/v1/jobs/{job.id}/start", {"claim_token": "not-a-uuid"}, format="json"
    )

    assert response.status_code == 400
    assert "claim_token" in response.json()["error"]["details"]
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING


@pytest.mark.parametrize("status", ["succeeded", "failed", "canceled"])
def test_a_finished_job_is_refused_as_not_pending(worker, worker_api, status):
    job = JobFactory(automation=worker.automation, status=status)

    response = start(worker_api, job.id)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "not_pending"
    assert events_of(job.id) == []


def test_the_claim_is_refused_when_the_automation_is_at_its_limit(worker, worker_api):
    worker.automation.max_concurrency = 2
    worker.automation.save()
    RunningJobFactory.create_batch(2, automation=worker.automation)
    job = JobFactory(automation=worker.automation)

    response = start(worker_api, job.id)

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "concurrency_limit"
    assert error["details"] == {"running": 2, "max_concurrency": 2}
    job.refresh_from_db()
    assert job.status == Job.Status.PENDING and job.claim_token is None


def test_finished_jobs_do_not_count_against_the_limit(worker, worker_api):
    JobFactory(automation=worker.automation, status=Job.Status.SUCCEEDED)
    job = JobFactory(automation=worker.automation)

    assert start(worker_api, job.id).status_code == 200


def test_a_refused_claim_is_logged_at_info_not_as_an_error(worker, worker_api, caplog):
    job = RunningJobFactory(automation=worker.automation)

    with caplog.at_level(logging.DEBUG):
        start(worker_api, job.id)

    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert [r.levelno for r in refusals] == [logging.INFO]
    assert "already_claimed" in refusals[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_worker_cannot_claim_another_automations_job(worker_api):
    foreign = JobFactory()

    response = start(worker_api, foreign.id)

    assert response.status_code == 404
    foreign.refresh_from_db()
    assert foreign.status == Job.Status.PENDING
    assert events_of(foreign.id) == []


def test_a_missing_job_is_a_404(worker_api):
    assert start(worker_api, 10**9).status_code == 404


def test_people_cannot_claim_jobs_with_their_access_token(worker, user):
    job = JobFactory(automation=worker.automation, tenant=user.tenant)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_access_token(user).token}")

    response = start(client, job.id)

    assert response.status_code == 401
    assert Job.objects.get(pk=job.id).status == Job.Status.PENDING


def test_an_authenticated_person_is_not_a_worker(worker, user):
    job = JobFactory(automation=worker.automation, tenant=user.tenant)

    response = start(client_of(user), job.id)

    assert response.status_code == 403
    assert Job.objects.get(pk=job.id).status == Job.Status.PENDING


def test_a_wrong_credential_is_refused(worker):
    job = JobFactory(automation=worker.automation)
    worker.credential = "hdw_not-the-credential"

    assert start(worker_client(worker), job.id).status_code == 401


def test_a_deactivated_worker_cannot_claim(worker, worker_api):
    job = JobFactory(automation=worker.automation)
    worker.is_active = False
    worker.save()

    assert start(worker_api, job.id).status_code == 401
    assert Job.objects.get(pk=job.id).status == Job.Status.PENDING


# --- the poll -----------------------------------------------------------------------------


def test_the_poll_lists_the_automations_pending_jobs_oldest_first(worker, worker_api):
    now = timezone.now()
    newer = JobFactory(automation=worker.automation, created_at=now)
    older = JobFactory(automation=worker.automation, created_at=now - timezone.timedelta(minutes=1))
    RunningJobFactory(automation=worker.automation)
    JobFactory(automation=worker.automation, status=Job.Status.CANCELED)
    JobFactory()  # another automation's

    response = worker_api.get("/api/v1/worker/jobs")

    assert response.status_code == 200
    assert [item["id"] for item in response.json()] == [older.id, newer.id]


def test_the_poll_is_limited(worker, worker_api):
    JobFactory.create_batch(3, automation=worker.automation)

    response = worker_api.get("/api/v1/worker/jobs", {"limit": 2})

    assert len(response.json()) == 2


@pytest.mark.parametrize("limit", ["0", "101", "x"])
def test_a_bad_poll_limit_is_a_400(worker_api, limit):
    response = worker_api.get("/api/v1/worker/jobs", {"limit": limit})

    assert response.status_code == 400


def test_another_workers_poll_does_not_see_the_jobs(worker):
    JobFactory(automation=worker.automation)
    stranger = WorkerFactory()

    assert worker_client(stranger).get("/api/v1/worker/jobs").json() == []
