"""Triggering a job: POST /api/v1/jobs."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import override_settings

from job.models import Job
from outbox.models import Event, OutboxMessage
from tests.clients import client_of
from tests.factories import AutomationFactory, UserFactory
from tests.job.support import events_of, worker_client

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs"


def test_a_job_is_created_pending_and_returned_at_once(person_client, automation, user):
    response = person_client.post(
        URL, {"automation": automation.id, "params": {"invoice": 42}}, format="json"
    )

    assert response.status_code == 201, response.json()
    body = response.json()
    job = Job.objects.get(pk=body["id"])
    assert body["status"] == "pending" and job.status == Job.Status.PENDING
    assert body["automation"] == automation.id
    assert body["params"] == {"invoice": 42}
    assert body["requested_by"] == user.id
    assert body["attempt"] == 0
    assert job.tenant_id == user.tenant_id


def test_job_created_is_recorded_on_the_tenant_outbox_with_integer_ids(
    person_client, automation, user
):
    body = person_client.post(URL, {"automation": automation.id}, format="json").json()

    event = Event.objects.get(type="JobCreated")
    assert event.payload["job_id"] == body["id"]
    assert event.payload["automation_id"] == automation.id
    assert isinstance(event.payload["job_id"], int)
    assert isinstance(event.payload["automation_id"], int)
    assert event.tenant_id == user.tenant_id
    assert event.actor == f"user:{user.id}"
    # Its subscribers' messages go to the tenant outbox; the worker's to its own queue.
    destinations = {row.envelope["destination"] for row in OutboxMessage.objects.all()}
    assert f"automation-{automation.id}" in destinations
    assert set(OutboxMessage.objects.values_list("tenant_id", flat=True)) == {user.tenant_id}


def test_parameters_default_to_an_empty_object(person_client, automation):
    body = person_client.post(URL, {"automation": automation.id}, format="json").json()

    assert body["params"] == {}


def test_an_inactive_automation_is_refused_with_its_own_code(person_client):
    automation = AutomationFactory(is_active=False)

    response = person_client.post(URL, {"automation": automation.id}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "automation_inactive"
    assert not Job.objects.exists() and not Event.objects.exists()


def test_an_unknown_automation_is_a_clear_400(person_client):
    response = person_client.post(URL, {"automation": 987654}, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_automation"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"automation": "x"},
        {"automation": 0},
        {"automation": None},
        {"automation": 1, "params": [1, 2]},
        {"automation": 1, "params": "text"},
    ],
)
def test_malformed_input_is_a_400_in_the_error_format(person_client, automation, body):
    if body.get("automation") == 1:
        body = {**body, "automation": automation.id}

    response = person_client.post(URL, body, format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_a_body_that_is_not_json_is_a_400(person_client):
    response = person_client.post(URL, "{not json", content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"


def test_parameters_are_validated_against_the_automations_schema(person_client):
    automation = AutomationFactory(
        params_schema={
            "type": "object",
            "properties": {"invoice": {"type": "integer"}},
            "required": ["invoice"],
            "additionalProperties": False,
        }
    )

    refused = person_client.post(
        URL, {"automation": automation.id, "params": {"invoice": "x"}}, format="json"
    )
    accepted = person_client.post(
        URL, {"automation": automation.id, "params": {"invoice": 7}}, format="json"
    )

    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["code"] == "invalid_params"
    assert any(message.startswith("invoice:") for message in error["details"]["params"])
    assert accepted.status_code == 201


def test_a_broken_parameter_schema_is_a_409_not_a_500(person_client):
    automation = AutomationFactory(params_schema={"type": "no-such-type"})

    response = person_client.post(URL, {"automation": automation.id}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "automation_misconfigured"


@pytest.mark.parametrize(
    "schema",
    [
        {"$ref": "http://127.0.0.1:9/schema.json"},
        {"properties": {"invoice": {"$ref": "#/$defs/missing"}}},
    ],
)
def test_a_schema_with_a_reference_leading_nowhere_is_a_409_and_fetches_nothing(
    person_client, monkeypatch, schema
):
    fetched = []
    monkeypatch.setattr("urllib.request.urlopen", lambda *args, **kwargs: fetched.append(args))
    automation = AutomationFactory(params_schema=schema)

    response = person_client.post(
        URL, {"automation": automation.id, "params": {"invoice": 1}}, format="json"
    )

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "automation_misconfigured"
    assert fetched == []
    assert not Job.objects.exists()


@pytest.mark.parametrize("params", [{"note": "a\u0000b"}, {"\u0000": 1}, {"list": [["\u0000"]]}])
def test_parameters_with_a_nul_character_are_a_400_not_a_500(person_client, automation, params):
    # PostgreSQL's jsonb cannot store U+0000: the request parser refuses it.
    response = person_client.post(
        URL, {"automation": automation.id, "params": params}, format="json"
    )

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"
    assert list(response.json()["error"]["details"]) == ["params"]
    assert not Job.objects.exists()


@override_settings(JOB_PARAMS_MAX_BYTES=100)
def test_parameters_over_the_size_limit_are_refused(person_client, automation):
    response = person_client.post(
        URL, {"automation": automation.id, "params": {"blob": "x" * 200}}, format="json"
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "params_too_large"
    assert not Job.objects.exists()


def test_workers_cannot_trigger_jobs(worker):
    response = worker_client(worker).post(URL, {"automation": worker.automation_id}, format="json")

    assert response.status_code == 401
    assert not Job.objects.exists()


def test_anonymous_callers_cannot_trigger_jobs(client, automation):
    response = client.post(URL, {"automation": automation.id}, content_type="application/json")

    assert response.status_code == 401


# --- idempotency -------------------------------------------------------------------------


def test_the_same_idempotency_key_returns_the_same_job(person_client, automation):
    request = {"automation": automation.id, "params": {"a": 1}}

    first = person_client.post(URL, request, format="json", HTTP_IDEMPOTENCY_KEY="order-17")
    again = person_client.post(URL, request, format="json", HTTP_IDEMPOTENCY_KEY="order-17")

    assert first.status_code == 201
    assert again.status_code == 200
    assert again.json() == first.json()
    assert Job.objects.count() == 1
    assert events_of(first.json()["id"]) == ["JobCreated"]


def test_the_same_key_in_another_tenant_is_another_job(person_client, automation, other_person):
    request = {"automation": automation.id}

    mine = person_client.post(URL, request, format="json", HTTP_IDEMPOTENCY_KEY="k")
    theirs = client_of(other_person).post(URL, request, format="json", HTTP_IDEMPOTENCY_KEY="k")

    assert (mine.status_code, theirs.status_code) == (201, 201)
    assert mine.json()["id"] != theirs.json()["id"]


def test_a_key_reused_for_another_request_is_refused(person_client, automation):
    person_client.post(
        URL,
        {"automation": automation.id, "params": {"a": 1}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    )

    response = person_client.post(
        URL,
        {"automation": automation.id, "params": {"a": 2}},
        format="json",
        HTTP_IDEMPOTENCY_KEY="k",
    )

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"
    assert Job.objects.count() == 1


def test_an_oversized_idempotency_key_is_a_400(person_client, automation):
    response = person_client.post(
        URL, {"automation": automation.id}, format="json", HTTP_IDEMPOTENCY_KEY="k" * 256
    )

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_idempotency_key"


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_with_one_key_create_one_job():
    person = UserFactory()
    automation = AutomationFactory()
    barrier = threading.Barrier(8)
    responses = []

    def trigger():
        try:
            client = client_of(person)
            barrier.wait()
            responses.append(
                client.post(
                    URL,
                    {"automation": automation.id, "params": {"n": 1}},
                    format="json",
                    HTTP_IDEMPOTENCY_KEY="retry-storm",
                )
            )
        finally:
            connection.close()

    threads = [threading.Thread(target=trigger) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(r.status_code for r in responses) == [200] * 7 + [201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert Job.objects.count() == 1
    assert Event.objects.filter(type="JobCreated").count() == 1
