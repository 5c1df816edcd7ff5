"""Running a finished job again: POST /api/v1/jobs/{id}/rerun."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from job.models import Job
from outbox.models import Event, OutboxMessage, TaskRun
from tests.clients import client_of
from tests.factories import AutomationFactory, JobFactory, RunningJobFactory, UserFactory
from tests.job.support import events_of, worker_client
from tests.job.test_round_trips import statements

pytestmark = pytest.mark.django_db

SCHEMA = {
    "type": "object",
    "properties": {"invoice": {"type": "integer"}},
    "required": ["invoice"],
}


def rerun(client, job, **headers):
    return client.post(f"/api/v1/jobs/{job.id}/rerun", **headers)


def finished_job(tenant, automation=None, *, status="failed", params=None) -> Job:
    return JobFactory(
        tenant=tenant,
        automation=automation or AutomationFactory(params_schema=SCHEMA),
        params={"invoice": 7} if params is None else params,
        status=status,
    )


@pytest.mark.parametrize("status", ["succeeded", "failed", "canceled"])
def test_a_finished_job_runs_again_as_a_new_pending_job_that_names_it(person_client, user, status):
    old = finished_job(user.tenant, status=status)

    response = rerun(person_client, old)

    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["id"] != old.id
    assert body["status"] == "pending" and body["attempt"] == 0
    assert body["automation"] == old.automation_id
    assert body["params"] == {"invoice": 7}
    assert body["rerun_of"] == old.id
    # Whoever ran it again asked for it, not the person who asked for the first.
    assert body["requested_by"] == user.id != old.requested_by_id
    assert body["triggered_by"] is None
    new = Job.objects.get(pk=body["id"])
    assert new.rerun_of_id == old.id and new.tenant_id == user.tenant_id
    old.refresh_from_db()
    assert old.status == status and old.rerun_of_id is None
    assert person_client.get(f"/api/v1/jobs/{old.id}").json()["rerun_of"] is None
    assert person_client.get(f"/api/v1/jobs/{new.id}").json()["rerun_of"] == old.id


def test_a_rerun_of_a_rerun_names_the_job_it_runs_again(person_client, user):
    first = finished_job(user.tenant)
    second = Job.objects.get(pk=rerun(person_client, first).json()["id"])
    Job.objects.filter(pk=second.pk).update(status=Job.Status.SUCCEEDED)

    third = rerun(person_client, second).json()

    assert third["rerun_of"] == second.id


@pytest.mark.django_db(transaction=True)
def test_job_created_and_its_outbox_rows_are_written_in_the_transaction_of_the_new_job():
    user = UserFactory()
    old = finished_job(user.tenant)
    client = client_of(user, token=True)

    with CaptureQueriesContext(connection) as captured:
        response = rerun(client, old)

    assert response.status_code == 201, response.json()
    # As POST /jobs writes a job (tests/job/test_round_trips.py), after the reads of the
    # job run again and of its tenant: one transaction, the job with its event and rows.
    assert statements(captured.captured_queries) == [
        "SELECT users",
        "SELECT jobs",
        "SELECT tenants",
        "SELECT automations",
        "BEGIN",
        "INSERT jobs + events + task_runs + outbox_messages",
        "COMMIT",
    ]
    new_id = response.json()["id"]
    assert events_of(new_id) == ["JobCreated"]
    assert events_of(old.id) == []
    event = Event.objects.get(aggregate_type="Job", aggregate_id=str(new_id))
    assert event.tenant_id == user.tenant_id and event.actor == f"user:{user.id}"
    assert event.payload["job_id"] == new_id
    assert event.payload["automation_id"] == old.automation_id
    assert event.payload["requested_by"] == user.id
    assert event.payload["rerun_of"] == old.id
    messages = OutboxMessage.objects.filter(envelope__event_id=event.pk)
    assert {row.envelope["task"] for row in messages} == {
        "machines.power_on",
        "worker.job_available",
    }
    assert f"automation-{old.automation_id}" in {row.envelope["destination"] for row in messages}
    assert {row.envelope["payload"]["rerun_of"] for row in messages} == {old.id}
    assert TaskRun.objects.filter(run_id__in=messages.values("run_id")).count() == 1


def test_a_job_nobody_ran_again_says_so_in_its_job_created(person_client, automation):
    body = person_client.post("/api/v1/jobs", {"automation": automation.id}, format="json").json()

    assert Event.objects.get(type="JobCreated").payload["rerun_of"] is None
    assert body["rerun_of"] is None


@pytest.mark.parametrize("factory", [JobFactory, RunningJobFactory])
def test_a_job_not_finished_is_refused_and_nothing_is_created(person_client, user, factory):
    job = factory(tenant=user.tenant)

    response = rerun(person_client, job)

    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "job_not_finished"
    assert error["details"] == {"status": job.status}
    assert Job.objects.count() == 1
    assert not Event.objects.exists()


def test_another_tenants_job_is_a_404_as_reading_it_is(person_client, other_tenant):
    job = finished_job(other_tenant)

    response = rerun(person_client, job)

    assert response.status_code == 404
    assert response.json() == person_client.get(f"/api/v1/jobs/{job.id}").json()
    assert response.json()["error"]["code"] == "job_not_found"
    assert Job.objects.count() == 1
    assert not Event.objects.exists()


def test_a_job_that_does_not_exist_is_a_404(person_client):
    response = person_client.post("/api/v1/jobs/987654/rerun")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


def test_anonymous_callers_and_workers_cannot_run_a_job_again(client, user, worker):
    job = finished_job(user.tenant, worker.automation)

    anonymous = client.post(f"/api/v1/jobs/{job.id}/rerun")
    by_a_worker = rerun(worker_client(worker), job)

    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["code"] == "not_authenticated"
    assert by_a_worker.status_code == 401
    assert Job.objects.count() == 1


def test_params_the_automations_schema_now_refuses_are_a_400(person_client, user):
    job = finished_job(user.tenant, params={"invoice": "7"})  # accepted by an older schema

    response = rerun(person_client, job)

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_params"
    assert any(message.startswith("invoice:") for message in error["details"]["params"])
    assert Job.objects.count() == 1
    assert not Event.objects.exists()


def test_an_automation_inactive_now_is_refused_with_its_own_code(person_client, user):
    job = finished_job(user.tenant, AutomationFactory(is_active=False))

    response = rerun(person_client, job)

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "automation_inactive"
    assert Job.objects.count() == 1
    assert not Event.objects.exists()


def test_the_method_is_post_only(person_client, user):
    job = finished_job(user.tenant)

    response = person_client.get(f"/api/v1/jobs/{job.id}/rerun")

    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"


# --- idempotency -------------------------------------------------------------------------


def test_the_same_idempotency_key_returns_the_same_new_job(person_client, user):
    old = finished_job(user.tenant)

    first = rerun(person_client, old, HTTP_IDEMPOTENCY_KEY="rerun-1")
    again = rerun(person_client, old, HTTP_IDEMPOTENCY_KEY="rerun-1")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json() == first.json()
    assert Job.objects.count() == 2
    assert events_of(first.json()["id"]) == ["JobCreated"]


def test_a_key_reused_for_another_request_is_refused(person_client, user):
    automation = AutomationFactory(params_schema=SCHEMA)
    old, other = finished_job(user.tenant, automation), finished_job(user.tenant, automation)
    created = rerun(person_client, old, HTTP_IDEMPOTENCY_KEY="k").json()

    # Another job of the same automation with the same params, and a plain trigger of
    # them: each is another request than the re-run of ``old``.
    of_another_job = rerun(person_client, other, HTTP_IDEMPOTENCY_KEY="k")
    a_trigger = person_client.post(
        "/api/v1/jobs",
        {"automation": automation.id, "params": {"invoice": 7}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    )

    for response in (of_another_job, a_trigger):
        assert response.status_code == 409
        error = response.json()["error"]
        assert error["code"] == "idempotency_key_reused"
        assert error["details"] == {"job": created["id"]}
    assert Job.objects.count() == 3


def test_a_key_a_trigger_used_is_refused_for_a_rerun_of_its_job(person_client, user):
    triggered = person_client.post(
        "/api/v1/jobs",
        {"automation": AutomationFactory(params_schema=SCHEMA).id, "params": {"invoice": 7}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    ).json()
    Job.objects.filter(pk=triggered["id"]).update(status=Job.Status.SUCCEEDED)

    response = rerun(person_client, Job.objects.get(pk=triggered["id"]), HTTP_IDEMPOTENCY_KEY="k")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"


def test_an_oversized_idempotency_key_is_a_400(person_client, user):
    job = finished_job(user.tenant)

    response = rerun(person_client, job, HTTP_IDEMPOTENCY_KEY="k" * 256)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"
    assert Job.objects.count() == 1
