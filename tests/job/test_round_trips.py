"""The round trips to PostgreSQL of POST /api/v1/jobs and of authentication, counted.

Every statement the request sends is captured, BEGIN and COMMIT included, so a change that
adds one (a savepoint, a lazy foreign key, a second read of the user) fails here. The
counts are a ceiling that says what each statement is for, not a timing.
"""

from __future__ import annotations

import json
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from identity.services import tenant_deactivate, user_deactivate
from job import automation_terms
from job.models import Job
from outbox.models import Event, OutboxMessage, TaskRun
from tests.clients import client_of
from tests.factories import AutomationFactory, PlatformAdminFactory, UserFactory
from webhook.models import WebhookDelivery
from webhook.services import endpoint_create

# Outside the request's transaction: the caller (authentication). The automation's terms
# (active, its schema) are those the process kept from an earlier request: the job's
# INSERT checks that they still hold (tests/job/test_automation_terms.py).
# Inside it: BEGIN, the job with JobCreated in the trail and its runs and outbox rows (one
# statement, which also tells whether some webhook endpoint of the tenant wants the event:
# none here, so nothing more is read or written), COMMIT.
POST_STATEMENTS = [
    "SELECT users",
    "BEGIN",
    "INSERT jobs + events + task_runs + outbox_messages",
    "COMMIT",
]
# The first job of an automation in a process reads its terms first.
FIRST_POST_STATEMENTS = [POST_STATEMENTS[0], "SELECT automations", *POST_STATEMENTS[1:]]


def statements(captured) -> list[str]:
    """Each statement as its verb and table: ``INSERT jobs``, ``SAVEPOINT``, ``COMMIT``."""
    out = []
    for query in captured:
        words = query["sql"].replace('"', "").split()
        verb = words[0].upper()
        if verb == "SELECT":
            table = words[words.index("FROM") + 1] if "FROM" in words else ""
            out.append(f"SELECT {table}")
        elif verb == "INSERT":
            out.append(f"INSERT {words[2]}")
        elif verb == "WITH":  # one statement, several INSERTs chained
            tables = re.findall(r'INSERT INTO "?(\w+)"?', query["sql"])
            out.append(f"INSERT {' + '.join(tables)}")
        else:
            out.append(verb)
    return out


def post_job(client, automation, **headers):
    with CaptureQueriesContext(connection) as captured:
        response = client.post(
            "/api/v1/jobs",
            {"automation": automation.id, "params": {"invoice": 7}},
            format="json",
            **headers,
        )
    return response, statements(captured.captured_queries)


@pytest.mark.django_db(transaction=True)
def test_a_post_is_four_statements_without_a_savepoint():
    user = UserFactory()
    automation = AutomationFactory()
    client = client_of(user, token=True)
    automation_terms.forget_all()

    first, sent_first = post_job(client, automation)
    response, sent = post_job(client, automation)

    assert first.status_code == 201, first.json()
    assert sent_first == FIRST_POST_STATEMENTS
    assert response.status_code == 201, response.json()
    assert sent == POST_STATEMENTS
    # What those statements wrote is all there, committed together, each naming the job.
    job = Job.objects.get(pk=response.json()["id"])
    event = Event.objects.get(aggregate_type="Job", aggregate_id=str(job.pk))
    assert event.payload["job_id"] == job.pk
    messages = OutboxMessage.objects.filter(envelope__event_id=event.pk)
    assert [message.envelope["payload"] for message in messages] == [event.payload] * 2
    assert TaskRun.objects.filter(run_id__in=messages.values("run_id")).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_post_with_an_idempotency_key_adds_the_lookup_and_one_savepoint_only():
    user = UserFactory()
    automation = AutomationFactory()
    client = client_of(user, token=True)
    automation_terms.forget_all()

    first, sent = post_job(client, automation, HTTP_IDEMPOTENCY_KEY="order-1")
    again, sent_again = post_job(client, automation, HTTP_IDEMPOTENCY_KEY="order-1")

    assert first.status_code == 201 and again.status_code == 200
    assert again.json()["id"] == first.json()["id"]
    assert sent == [
        "SELECT users",
        "SELECT jobs",  # the key's earlier job, if any
        "SELECT automations",  # the first job of the automation in this process
        "BEGIN",
        "SAVEPOINT",  # a concurrent request with the same key may win the insert
        "INSERT jobs + events + task_runs + outbox_messages",
        "RELEASE",
        "COMMIT",
    ]
    # A replay reads and writes nothing more than the job it returns.
    assert sent_again == ["SELECT users", "SELECT jobs"]


@pytest.mark.django_db(transaction=True)
def test_an_endpoint_that_wants_job_created_gets_its_delivery_naming_the_job(settings):
    """The listener runs after the one statement, in its transaction: it reads the job that
    statement wrote, and its rows commit with it."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    user = UserFactory()
    automation = AutomationFactory()
    endpoint = endpoint_create(
        tenant=user.tenant, url="http://127.0.0.1:9/hooks", event_types=["JobCreated"], actor=user
    )
    client = client_of(user, token=True)

    response, sent = post_job(client, automation)

    assert response.status_code == 201, response.json()
    assert sent[-1] == "COMMIT" and sent.count("BEGIN") == 1
    job_id = response.json()["id"]
    event = Event.objects.get(type="JobCreated", aggregate_id=str(job_id))
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.event_id == event.pk
    body = json.loads(delivery.body)
    assert body["data"]["job_id"] == job_id
    assert body["data"]["job"]["id"] == job_id
    assert delivery.scheduled_run_id is not None


@pytest.mark.django_db(transaction=True)
def test_authentication_is_one_read_of_the_user_with_the_tenant():
    client = client_of(UserFactory(), token=True)

    with CaptureQueriesContext(connection) as captured:
        response = client.get("/api/v1/me")

    assert response.status_code == 200
    assert statements(captured.captured_queries) == ["SELECT users"]
    assert "tenants" in captured.captured_queries[0]["sql"]  # joined, not read apart


@pytest.mark.django_db
def test_a_deactivated_person_is_refused_at_their_next_post():
    user = UserFactory()
    automation = AutomationFactory()
    client = client_of(user, token=True)
    assert post_job(client, automation)[0].status_code == 201

    user_deactivate(user=user, actor=PlatformAdminFactory())
    response, _ = post_job(client, automation)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "account_inactive"
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_the_people_of_a_deactivated_tenant_are_refused_at_their_next_post():
    user = UserFactory()
    automation = AutomationFactory()
    client = client_of(user, token=True)
    assert post_job(client, automation)[0].status_code == 201

    tenant_deactivate(tenant=user.tenant, actor=PlatformAdminFactory())
    response, _ = post_job(client, automation)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "account_inactive"
    assert Job.objects.count() == 1
