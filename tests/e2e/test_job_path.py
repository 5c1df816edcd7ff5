"""The path of a job, end to end: from POST /api/v1/jobs to a succeeded job with its output.

All real: PostgreSQL, Redis, RabbitMQ, the API over HTTP, the relay, a background
worker, the local machine provider and the automation worker it starts.
"""

from __future__ import annotations

import pytest

from job.models import Job
from outbox.models import Event
from tests.e2e.conftest import job_status
from tests.polling import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def trigger(api, automation_id: int, **params) -> int:
    response = api.post(f"{api.base}/jobs", json={"automation": automation_id, "params": params})
    assert response.status_code == 201, response.text
    assert response.json()["status"] == "pending"
    return response.json()["id"]


def test_a_job_runs_end_to_end_through_power_on(system, catalog, api):
    automation = catalog("greeter").automation
    system.relay()
    system.background_worker()

    job_id = trigger(api, automation.id, name="Ada")

    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=90,
        message=lambda: f"job is {job_status(job_id)}\n{system.log_text()}",
    )
    job = Job.objects.get(pk=job_id)
    assert "hello, Ada!" in job.output_tail
    assert job.exit_code == 0 and job.attempt == 1
    events = list(
        Event.objects.filter(aggregate_type="Job", aggregate_id=str(job_id))
        .order_by("id")
        .values_list("type", flat=True)
    )
    assert events == ["JobCreated", "JobStarted", "JobCompleted"]
    # The API shows the outcome to the person who asked.
    body = api.get(f"{api.base}/jobs/{job_id}").json()
    assert body["status"] == "succeeded"
    assert "hello, Ada!" in body["output_tail"]


def test_a_running_worker_takes_the_job_from_its_queue(system, catalog, api):
    created = catalog("listener")
    system.relay()
    # It polls once at start, then only its queue can tell it about new jobs.
    worker = system.automation_worker(
        "listener", created.credential, AGENT_POLL_INTERVAL="3600", AGENT_IDLE_TIMEOUT="0"
    )
    wait_until(
        lambda: created.automation.worker.__class__.objects.filter(
            pk=created.automation.worker.pk, status="online"
        ).exists(),
        timeout=30,
        message=system.log_text,
    )

    job_id = trigger(api, created.automation.id, name="queue")

    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=60,
        message=lambda: f"job is {job_status(job_id)}\n{system.log_text()}",
    )
    assert "hello, queue!" in Job.objects.get(pk=job_id).output_tail
    assert worker.poll() is None


def test_a_job_whose_message_is_lost_is_found_by_the_poll(system, catalog, api):
    created = catalog("poller")
    # No relay: the outbox row is never published, as if the message were lost.
    system.automation_worker("poller", created.credential, AGENT_POLL_INTERVAL="0.5")

    job_id = trigger(api, created.automation.id, name="poll")

    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=60,
        message=lambda: f"job is {job_status(job_id)}\n{system.log_text()}",
    )
    assert "hello, poll!" in Job.objects.get(pk=job_id).output_tail
