"""A job is checked against its automation's terms as a process keeps them, and written only
while the automation still has them (job.automation_terms): a change is seen by the very
next request, whatever the process had kept."""

from __future__ import annotations

import logging
import threading
import time

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from automation.models import Automation
from automation.services import automation_deactivate
from job import automation_terms
from job.models import Job
from outbox.models import Event, OutboxMessage
from tests.clients import client_of
from tests.factories import AutomationFactory, PlatformAdminFactory, UserFactory, WorkerFactory
from tests.job.test_round_trips import statements

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs"
INVOICE_IS_A_NUMBER = {
    "type": "object",
    "properties": {"invoice": {"type": "integer"}},
    "required": ["invoice"],
}
INVOICE_IS_A_TEXT = {**INVOICE_IS_A_NUMBER, "properties": {"invoice": {"type": "string"}}}


def post(client, automation, params):
    return client.post(URL, {"automation": automation.id, "params": params}, format="json")


@pytest.mark.django_db(transaction=True)
def test_an_automation_deactivated_after_a_job_refuses_the_next_one():
    person_client = client_of(UserFactory(), token=True)
    automation = WorkerFactory().automation
    assert post(person_client, automation, {}).status_code == 201
    assert automation_terms.cached(automation.id).is_active  # kept by this process

    automation_deactivate(automation_id=automation.id, actor=PlatformAdminFactory())
    with CaptureQueriesContext(connection) as captured:
        response = post(person_client, automation, {})

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "automation_inactive"
    # The write on the kept terms found them changed and wrote nothing; the terms read
    # again decided the refusal.
    assert statements(captured.captured_queries) == [
        "SELECT users",
        "BEGIN",
        "INSERT jobs + events + task_runs + outbox_messages",
        "ROLLBACK",
        "SELECT automations",
    ]
    assert Job.objects.count() == 1
    assert Event.objects.filter(type="JobCreated").count() == 1


def test_a_change_made_around_the_services_is_seen_too(person_client, automation):
    """The write compares the automation's row itself, not a timestamp its services keep."""
    assert post(person_client, automation, {}).status_code == 201

    Automation.objects.filter(pk=automation.pk).update(is_active=False)

    response = post(person_client, automation, {})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "automation_inactive"
    assert Job.objects.count() == 1


def test_a_new_schema_refuses_the_params_the_old_one_accepted(person_client):
    automation = AutomationFactory(params_schema=INVOICE_IS_A_NUMBER)
    assert post(person_client, automation, {"invoice": 7}).status_code == 201

    Automation.objects.filter(pk=automation.pk).update(params_schema=INVOICE_IS_A_TEXT)

    response = post(person_client, automation, {"invoice": 7})
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_params"
    assert Job.objects.count() == 1
    assert OutboxMessage.objects.filter(envelope__event="JobCreated").count() == 2


def test_a_new_schema_accepts_the_params_the_old_one_refused(person_client):
    automation = AutomationFactory(params_schema=INVOICE_IS_A_NUMBER)
    assert post(person_client, automation, {"invoice": "x"}).status_code == 400

    Automation.objects.filter(pk=automation.pk).update(params_schema=INVOICE_IS_A_TEXT)

    response = post(person_client, automation, {"invoice": "x"})
    assert response.status_code == 201, response.json()
    assert Job.objects.get().params == {"invoice": "x"}


@pytest.mark.django_db(transaction=True)
def test_a_refusal_on_terms_that_still_hold_reads_them_once(caplog):
    person_client = client_of(UserFactory(), token=True)
    automation = AutomationFactory(params_schema={"type": "no-such-type"})
    assert post(person_client, automation, {}).status_code == 409
    caplog.clear()

    with (
        CaptureQueriesContext(connection) as captured,
        caplog.at_level(logging.ERROR, logger="hubdommed.job"),
    ):
        response = post(person_client, automation, {})

    assert response.json()["error"]["code"] == "automation_misconfigured"
    assert statements(captured.captured_queries) == ["SELECT users", "SELECT automations"]
    assert len([r for r in caplog.records if "unusable" in r.getMessage()]) == 1


def test_an_unknown_automation_is_not_kept(person_client):
    response = post(person_client, Automation(id=10**9), {})

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "unknown_automation"
    assert automation_terms.cached(10**9) is None


@pytest.mark.django_db(transaction=True)
def test_no_request_begun_after_a_deactivation_creates_a_job():
    """Four clients trigger jobs of one automation without pause; its deactivation commits
    in the middle. Whatever each process kept, a request that began after that commit is
    refused, and each job accepted before it has its JobCreated."""
    person = UserFactory()
    automation = WorkerFactory().automation
    accepted_before_any = threading.Event()
    deactivated_at: list[float] = []
    outcomes: list[tuple[float, int]] = []
    stop = threading.Event()

    def trigger():
        client = client_of(person, token=True)
        try:
            while not stop.is_set():
                began = time.monotonic()
                response = post(client, automation, {})
                outcomes.append((began, response.status_code))
                if response.status_code == 201:
                    accepted_before_any.set()
                elif deactivated_at and began > deactivated_at[0]:
                    return
        finally:
            connection.close()

    threads = [threading.Thread(target=trigger) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        assert accepted_before_any.wait(timeout=60)
        automation_deactivate(automation_id=automation.id, actor=PlatformAdminFactory())
        deactivated_at.append(time.monotonic())
        for thread in threads:
            thread.join(timeout=60)
    finally:
        stop.set()
        for thread in threads:
            thread.join()

    after = [status for began, status in outcomes if began > deactivated_at[0]]
    assert after and set(after) == {409}
    accepted = [status for _, status in outcomes if status == 201]
    assert Job.objects.count() == len(accepted) > 0
    assert Event.objects.filter(type="JobCreated").count() == len(accepted)
