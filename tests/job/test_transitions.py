"""The Job aggregate's transitions: every illegal move is a 409 that changes nothing
and records nothing; every legal one records its event exactly once."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from common.errors import Conflict
from job.models import Job
from outbox.models import Event, OutboxMessage
from tests.clients import client_of
from tests.factories import JobFactory, RunningJobFactory
from tests.job.support import events_of

NOW = datetime(2030, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
TOKEN = uuid.uuid4()


class FakeWorker:
    pk = 7


def job_in(status: str, **fields) -> Job:
    running = status == Job.Status.RUNNING
    defaults = {
        "pk": 1,
        "tenant_id": 1,
        "automation_id": 2,
        "status": status,
        "attempt": 1 if status != Job.Status.PENDING else 0,
        "claim_token": TOKEN if status != Job.Status.PENDING else None,
        "lease_expires_at": NOW + LEASE if running else None,
    }
    return Job(**{**defaults, **fields})


def state(job: Job) -> dict:
    return {f.attname: getattr(job, f.attname) for f in Job._meta.concrete_fields}


ILLEGAL = [
    # (status, transition, code)
    ("running", "start", "already_claimed"),
    ("succeeded", "start", "not_pending"),
    ("failed", "start", "not_pending"),
    ("canceled", "start", "not_pending"),
    ("pending", "heartbeat", "stale_claim"),
    ("succeeded", "heartbeat", "already_finished"),
    ("failed", "heartbeat", "already_finished"),
    ("canceled", "heartbeat", "already_finished"),
    ("pending", "complete", "stale_claim"),
    ("failed", "complete", "already_finished"),
    ("canceled", "complete", "already_finished"),
    ("pending", "fail", "stale_claim"),
    ("succeeded", "fail", "already_finished"),
    ("succeeded", "request_cancel", "already_finished"),
    ("failed", "request_cancel", "already_finished"),
    ("pending", "requeue", "not_running"),
    ("succeeded", "requeue", "already_finished"),
]


def attempt(job: Job, transition: str):
    calls = {
        "start": lambda: job.start(
            worker=FakeWorker(), lease=LEASE, now=NOW, running=0, max_concurrency=1
        ),
        "heartbeat": lambda: job.heartbeat(claim_token=TOKEN, lease=LEASE, now=NOW),
        "complete": lambda: job.complete(claim_token=TOKEN, result={"other": True}, now=NOW),
        "fail": lambda: job.fail(reason="error", error="other", claim_token=TOKEN, now=NOW),
        "request_cancel": lambda: job.request_cancel(now=NOW),
        "requeue": lambda: job.requeue(now=NOW),
    }
    return calls[transition]()


@pytest.mark.parametrize(("status", "transition", "code"), ILLEGAL)
def test_an_illegal_transition_raises_its_code_and_leaves_the_job_as_it_was(
    status, transition, code
):
    job = job_in(status)
    before = state(job)

    with pytest.raises(Conflict) as refused:
        attempt(job, transition)

    assert refused.value.code == code
    assert refused.value.status_code == 409
    assert state(job) == before


def test_a_claim_over_the_limit_is_refused_before_anything_changes():
    job = job_in("pending")
    before = state(job)

    with pytest.raises(Conflict) as refused:
        job.start(worker=FakeWorker(), lease=LEASE, now=NOW, running=2, max_concurrency=2)

    assert refused.value.code == "concurrency_limit"
    assert state(job) == before


def test_a_job_already_running_is_already_claimed_even_at_the_limit():
    job = job_in("running")

    with pytest.raises(Conflict) as refused:
        job.start(worker=FakeWorker(), lease=LEASE, now=NOW, running=1, max_concurrency=1)

    assert refused.value.code == "already_claimed"


def test_the_monitor_fails_a_lost_job_without_a_claim():
    job = job_in("running")

    event = job.fail(reason=Job.FailureReason.WORKER_LOST, now=NOW)

    assert job.status == Job.Status.FAILED
    assert job.failure_reason == "worker_lost"
    assert event.name == "JobFailed"
    assert event.payload == {
        "job_id": 1,
        "automation_id": 2,
        "attempt": 1,
        "failure_reason": "worker_lost",
        "exit_code": None,
    }


def test_a_requeued_job_is_pending_again_and_its_old_claim_is_stale():
    job = job_in("running")

    job.requeue(now=NOW)

    assert job.status == Job.Status.PENDING and job.claim_token is None
    with pytest.raises(Conflict) as refused:
        job.complete(claim_token=TOKEN, result=None, now=NOW)
    assert refused.value.code == "stale_claim"
    event = job.start(worker=FakeWorker(), lease=LEASE, now=NOW, running=0, max_concurrency=1)
    assert event.payload["attempt"] == 2 and job.claim_token != TOKEN


# --- through the API: refusals record nothing, transitions record once -----------------

API_ILLEGAL = [
    ("succeeded", "start"),
    ("failed", "start"),
    ("canceled", "start"),
    ("running", "start"),
    ("succeeded", "cancel"),
    ("failed", "cancel"),
    ("pending", "complete"),
    ("failed", "complete"),
    ("succeeded", "fail"),
    ("pending", "heartbeat"),
    ("canceled", "heartbeat"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("status", "action"), API_ILLEGAL)
def test_every_illegal_transition_is_a_409_that_writes_no_event(
    status, action, worker, worker_api, user
):
    factory = RunningJobFactory if status == "running" else JobFactory
    job = factory(
        tenant=user.tenant,
        automation=worker.automation,
        status=status,
        claim_token=uuid.uuid4(),
        lease_expires_at=NOW,
    )
    before = Job.objects.filter(pk=job.id).values().get()
    client = client_of(user) if action == "cancel" else worker_api
    body = {"claim_token": str(job.claim_token), "error": "x", "result": "different"}
    if action == "start":
        # A start naming the job's own claim is that claim sent again (test_claim.py):
        # this one is another worker's.
        body["claim_token"] = str(uuid.uuid4())

    response = client.post(f"/api/v1/jobs/{job.id}/{action}", body, format="json")

    assert response.status_code == 409, response.json()
    assert Job.objects.filter(pk=job.id).values().get() == before
    assert not Event.objects.exists() and not OutboxMessage.objects.exists()


@pytest.mark.django_db
def test_a_whole_run_records_each_event_exactly_once(person_client, worker, worker_api):
    created = person_client.post(
        "/api/v1/jobs", {"automation": worker.automation_id}, format="json"
    ).json()
    job_id = created["id"]
    claim = worker_api.post(f"/api/v1/jobs/{job_id}/start").json()
    token = claim["claim_token"]
    for _ in range(3):
        worker_api.post(f"/api/v1/jobs/{job_id}/heartbeat", {"claim_token": token}, format="json")
    for _ in range(2):
        worker_api.post(
            f"/api/v1/jobs/{job_id}/complete", {"claim_token": token, "result": 1}, format="json"
        )

    assert events_of(job_id) == ["JobCreated", "JobStarted", "JobCompleted"]
