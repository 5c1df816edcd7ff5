"""The running job's worker: heartbeat, complete, fail; and the stale claims refused."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from job.models import Job
from job.services import job_cancel
from outbox.models import Event
from tests.clients import client_of
from tests.factories import JobFactory, RunningJobFactory
from tests.job.support import events_of

pytestmark = pytest.mark.django_db


def post(client, job, action, **body):
    return client.post(f"/api/v1/jobs/{job.id}/{action}", body, format="json")


@pytest.fixture
def running(worker, worker_api):
    """A job this worker claimed through the API."""
    job = JobFactory(automation=worker.automation)
    assert worker_api.post(f"/api/v1/jobs/{job.id}/start").status_code == 200
    job.refresh_from_db()
    return job


# --- heartbeat ----------------------------------------------------------------------------


def test_a_heartbeat_extends_the_lease_and_keeps_the_progress(worker_api, running, settings):
    settings.JOB_LEASE_SECONDS = 60
    later = timezone.now() + timedelta(seconds=30)

    with time_machine.travel(later, tick=False):
        response = post(
            worker_api, running, "heartbeat", claim_token=str(running.claim_token), progress=0.5
        )

    assert response.status_code == 200, response.json()
    assert response.json()["cancel_requested"] is False
    running.refresh_from_db()
    assert running.lease_expires_at == later + timedelta(seconds=60)
    assert running.last_heartbeat_at == later
    assert running.progress == 0.5


def test_a_heartbeat_without_progress_keeps_the_last_one(worker_api, running):
    token = str(running.claim_token)
    post(worker_api, running, "heartbeat", claim_token=token, progress={"step": 2})

    post(worker_api, running, "heartbeat", claim_token=token)

    running.refresh_from_db()
    assert running.progress == {"step": 2}


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("heartbeat", {"progress": {"step": "a\u0000b"}}),
        ("complete", {"result": {"\u0000": 1}}),
    ],
)
def test_json_with_a_nul_character_is_a_400_not_a_500(worker_api, running, action, body):
    # PostgreSQL's jsonb cannot store U+0000.
    response = post(worker_api, running, action, claim_token=str(running.claim_token), **body)

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"
    running.refresh_from_db()
    assert running.status == Job.Status.RUNNING and running.progress is None


@pytest.mark.parametrize("action", ["complete", "fail"])
def test_nul_characters_in_the_commands_output_do_not_cost_the_report(worker_api, running, action):
    # A command may print any byte; PostgreSQL text cannot hold U+0000, so it is replaced.
    body = {"output_tail": "before\u0000after", "error": "bad\u0000byte"}
    if action == "complete":
        del body["error"]

    response = post(worker_api, running, action, claim_token=str(running.claim_token), **body)

    assert response.status_code == 200, response.content
    running.refresh_from_db()
    assert running.output_tail == "before\ufffdafter"
    assert running.error == ("bad\ufffdbyte" if action == "fail" else "")


def test_progress_over_the_size_limit_is_refused_and_changes_nothing(worker_api, running, settings):
    settings.JOB_RESULT_MAX_BYTES = 100

    response = post(
        worker_api, running, "heartbeat", claim_token=str(running.claim_token), progress="x" * 200
    )

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "progress_too_large"
    before = running.lease_expires_at
    running.refresh_from_db()
    assert running.progress is None and running.lease_expires_at == before


def test_a_heartbeat_writes_no_event(worker_api, running):
    post(worker_api, running, "heartbeat", claim_token=str(running.claim_token))

    assert events_of(running.id) == ["JobStarted"]


def test_the_heartbeat_tells_the_worker_the_job_was_canceled(worker_api, running, user):
    job_cancel(tenant=running.tenant_id, job_id=running.id, actor=user)

    response = post(worker_api, running, "heartbeat", claim_token=str(running.claim_token))

    assert response.status_code == 200
    assert response.json()["cancel_requested"] is True


# --- complete and fail --------------------------------------------------------------------


def test_completing_ends_the_job_succeeded_with_its_result(worker_api, running):
    response = post(
        worker_api, running, "complete", claim_token=str(running.claim_token), result={"n": 3}
    )

    assert response.status_code == 200, response.json()
    running.refresh_from_db()
    assert running.status == Job.Status.SUCCEEDED
    assert running.result == {"n": 3}
    assert running.finished_at is not None and running.lease_expires_at is None
    assert events_of(running.id) == ["JobStarted", "JobCompleted"]


def test_completing_keeps_the_exit_code_and_output_tail_and_shows_them_to_people(
    worker_api, running
):
    response = post(
        worker_api,
        running,
        "complete",
        claim_token=str(running.claim_token),
        result={"exit_code": 0},
        output_tail="done\n",
        exit_code=0,
    )

    assert response.status_code == 200, response.json()
    running.refresh_from_db()
    assert running.status == Job.Status.SUCCEEDED
    assert (running.result, running.output_tail, running.exit_code) == (
        {"exit_code": 0},
        "done\n",
        0,
    )
    assert Event.objects.get(type="JobCompleted").payload["exit_code"] == 0
    shown = client_of(running.requested_by).get(f"/api/v1/jobs/{running.id}").json()
    assert (shown["status"], shown["output_tail"], shown["exit_code"]) == ("succeeded", "done\n", 0)
    assert shown["result"] == {"exit_code": 0}


def test_completing_without_output_leaves_it_empty(worker_api, running):
    post(worker_api, running, "complete", claim_token=str(running.claim_token), result=None)

    running.refresh_from_db()
    assert (running.status, running.output_tail, running.exit_code) == ("succeeded", "", None)


def test_only_the_end_of_a_long_output_is_kept_on_success_too(worker_api, running, settings):
    settings.JOB_OUTPUT_TAIL_MAX_CHARS = 10

    post(
        worker_api,
        running,
        "complete",
        claim_token=str(running.claim_token),
        output_tail="0123456789abcdefghij",
        exit_code=0,
    )

    running.refresh_from_db()
    assert running.output_tail == "abcdefghij"


@pytest.mark.parametrize("action", ["complete", "fail"])
@pytest.mark.parametrize("exit_code", ["zero", 2**31, 1.5])
def test_an_exit_code_that_is_not_a_small_integer_is_a_400(worker_api, running, action, exit_code):
    response = post(
        worker_api,
        running,
        action,
        claim_token=str(running.claim_token),
        error="e",
        exit_code=exit_code,
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert Job.objects.get(pk=running.id).status == Job.Status.RUNNING


def test_failing_ends_the_job_failed_with_the_error_and_output_tail(worker_api, running):
    response = post(
        worker_api,
        running,
        "fail",
        claim_token=str(running.claim_token),
        error="boom",
        output_tail="last lines\n",
        exit_code=3,
    )

    assert response.status_code == 200, response.json()
    running.refresh_from_db()
    assert running.status == Job.Status.FAILED
    assert (running.error, running.output_tail, running.exit_code) == ("boom", "last lines\n", 3)
    assert running.failure_reason == Job.FailureReason.EXIT_CODE
    assert events_of(running.id) == ["JobStarted", "JobFailed"]
    payload = Event.objects.get(type="JobFailed").payload
    assert payload["failure_reason"] == "exit_code" and payload["exit_code"] == 3


def test_a_worker_may_say_the_command_timed_out(worker_api, running):
    post(
        worker_api,
        running,
        "fail",
        claim_token=str(running.claim_token),
        error="ran past 3600 s",
        reason="timeout",
    )

    running.refresh_from_db()
    assert running.failure_reason == Job.FailureReason.TIMEOUT


def test_only_the_end_of_a_long_output_is_kept(worker_api, running, settings):
    settings.JOB_OUTPUT_TAIL_MAX_CHARS = 10

    post(
        worker_api,
        running,
        "fail",
        claim_token=str(running.claim_token),
        error="e",
        output_tail="0123456789abcdefghij",
    )

    running.refresh_from_db()
    assert running.output_tail == "abcdefghij"


def test_a_result_over_the_limit_is_refused_and_changes_nothing(worker_api, running, settings):
    settings.JOB_RESULT_MAX_BYTES = 50

    response = post(
        worker_api, running, "complete", claim_token=str(running.claim_token), result="x" * 100
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "result_too_large"
    assert Job.objects.get(pk=running.id).status == Job.Status.RUNNING


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("complete", {"result": {"ok": True}}),
        ("complete", {"result": {"exit_code": 0}, "output_tail": "ok\n", "exit_code": 0}),
        ("fail", {"error": "boom", "exit_code": 1}),
        ("fail", {"error": "slow", "reason": "timeout", "output_tail": "..."}),
    ],
)
def test_repeating_the_same_report_is_idempotent(worker_api, running, action, body):
    token = str(running.claim_token)
    first = post(worker_api, running, action, claim_token=token, **body)

    again = post(worker_api, running, action, claim_token=token, **body)

    assert (first.status_code, again.status_code) == (200, 200)
    assert again.json() == first.json()
    assert len(events_of(running.id)) == 2  # JobStarted and one report


def test_a_different_second_report_is_refused(worker_api, running):
    token = str(running.claim_token)
    post(worker_api, running, "complete", claim_token=token, result=1)

    response = post(worker_api, running, "fail", claim_token=token, error="late")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
    running.refresh_from_db()
    assert running.status == Job.Status.SUCCEEDED and running.error == ""
    assert events_of(running.id) == ["JobStarted", "JobCompleted"]


@pytest.mark.parametrize(
    ("action", "body"),
    [
        ("heartbeat", {}),
        ("complete", {"result": 1}),
        ("fail", {"error": "boom"}),
    ],
)
def test_a_stale_claim_is_refused_and_changes_nothing(worker_api, running, action, body):
    before = Job.objects.filter(pk=running.id).values().get()

    response = post(worker_api, running, action, claim_token=str(uuid.uuid4()), **body)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_claim"
    assert Job.objects.filter(pk=running.id).values().get() == before
    assert events_of(running.id) == ["JobStarted"]


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail"])
def test_reports_on_a_pending_job_are_stale_claims(worker, worker_api, action):
    job = JobFactory(automation=worker.automation)

    response = post(worker_api, job, action, claim_token=str(uuid.uuid4()), error="x")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "stale_claim"
    assert events_of(job.id) == []


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail"])
def test_a_worker_cannot_report_another_automations_job(worker_api, action):
    foreign = RunningJobFactory()

    response = post(worker_api, foreign, action, claim_token=str(foreign.claim_token), error="x")

    assert response.status_code == 404
    foreign.refresh_from_db()
    assert foreign.status == Job.Status.RUNNING
    assert events_of(foreign.id) == []


@pytest.mark.parametrize("action", ["heartbeat", "complete", "fail"])
def test_a_report_without_a_valid_claim_token_is_a_400(worker_api, running, action):
    response = post(worker_api, running, action, claim_token="not-a-uuid", error="x")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_a_second_success_report_with_another_exit_code_is_refused(worker_api, running):
    token = str(running.claim_token)
    post(worker_api, running, "complete", claim_token=token, result=1, exit_code=0)

    response = post(worker_api, running, "complete", claim_token=token, result=1, exit_code=3)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
    assert Job.objects.get(pk=running.id).exit_code == 0


def test_a_heartbeat_after_the_end_is_refused(worker_api, running):
    token = str(running.claim_token)
    post(worker_api, running, "complete", claim_token=token)

    response = post(worker_api, running, "heartbeat", claim_token=token)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "already_finished"
