"""Re-runs under real parallelism: threads, each with its own database connection, asking
through the HTTP API against the real PostgreSQL, racing each other and the deactivations
of what the job belongs to."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import connection

from automation.services import automation_deactivate
from common.ways_forward import stranded_checks
from identity.services import tenant_deactivate
from job.models import Job
from outbox.models import Event
from tests.clients import client_of
from tests.factories import (
    AutomationWithWorkerFactory,
    JobFactory,
    PlatformAdminFactory,
    UserFactory,
)
from tests.job.test_claim_concurrency import run_threads
from tests.job.test_ways_forward import run_cancel_tasks
from tests.polling import wait_until

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(240),
    pytest.mark.many_connections,
]

RERUNNERS = 8
# Re-runs each re-runner asks for at most, racing a deactivation (it stops once refused).
REPEATS = 200


def post_until_answered(client, path: str, headers: dict):
    """A POST answered: a 503 (the database out of connections, shared with other test
    runs) is tried again after a pause (as ``test_claim_concurrency``'s, with headers)."""
    for _ in range(50):
        response = client.post(path, **headers)
        if response.status_code != 503:
            return response
        connection.close()
        time.sleep(0.2)
    return response


def finished_job(person, automation=None) -> Job:
    return JobFactory(
        tenant=person.tenant,
        automation=automation or AutomationWithWorkerFactory(),
        params={"invoice": 7},
        status=Job.Status.FAILED,
    )


def rerun_together(person, job, count: int, *, key: str | None = None, beside=None) -> list:
    """``count`` re-runs of ``job`` released together: their answers as (status, body).

    With ``beside`` (a callable run in a thread of its own, released with them), each
    re-runner asks again and again until it is refused (at most ``REPEATS`` times), so
    that the re-runs surely straddle what ``beside`` does: every answer is returned."""
    start = threading.Barrier(count + (beside is not None))
    answers: list[list] = [[] for _ in range(count)]
    headers = {} if key is None else {"HTTP_IDEMPOTENCY_KEY": key}
    repeats = 1 if beside is None else REPEATS

    def rerunner(n: int) -> None:
        try:
            # A bearer token, as callers send: each request reads its caller afresh.
            client = client_of(person, token=True, raise_request_exception=False)
            connection.ensure_connection()
            start.wait(timeout=60)
            for _ in range(repeats):
                response = post_until_answered(client, f"/api/v1/jobs/{job.id}/rerun", headers)
                answers[n].append((response.status_code, response.json()))
                if response.status_code >= 400:
                    break
        finally:
            connection.close()

    def other(n: int) -> None:
        try:
            connection.ensure_connection()
            start.wait(timeout=60)
            beside()
        finally:
            connection.close()

    threads = count + (beside is not None)
    run_threads(threads, lambda n: rerunner(n) if n < count else other(n))
    assert all(answers), "a re-run failed"
    return [answer for each in answers for answer in each]


def test_re_runs_of_one_job_with_one_key_at_once_create_one_job():
    person = UserFactory()
    job = finished_job(person)

    answers = rerun_together(person, job, RERUNNERS, key="rerun-once")

    assert Counter(status for status, _ in answers) == {201: 1, 200: RERUNNERS - 1}
    (new_id,) = {body["id"] for _, body in answers}
    assert Job.objects.filter(rerun_of=job).count() == 1
    assert Event.objects.filter(type="JobCreated", aggregate_id=str(new_id)).count() == 1


def test_re_runs_of_one_job_without_a_key_each_create_a_job_as_triggers_do():
    person = UserFactory()
    job = finished_job(person)

    answers = rerun_together(person, job, RERUNNERS)

    assert Counter(status for status, _ in answers) == {201: RERUNNERS}
    assert len({body["id"] for _, body in answers}) == RERUNNERS
    assert Job.objects.filter(rerun_of=job, status=Job.Status.PENDING).count() == RERUNNERS
    assert Event.objects.filter(type="JobCreated", actor=f"user:{person.id}").count() == RERUNNERS


def once_re_runs_are_made(job, deactivate):
    """``deactivate`` once the first re-runs of ``job`` are in: the re-runners, still
    asking, race it from then on."""

    def then_deactivate() -> None:
        wait_until(
            lambda: Job.objects.filter(rerun_of=job).count() >= 2,
            timeout=120,
            message="no re-run was created",
        )
        deactivate()

    return then_deactivate


def assert_no_pending_job_is_left_behind(settings, automation) -> None:
    """What the deactivation set going (its task), then the monitor's check for what the
    task could not see: no re-run is left pending with nothing to move it."""
    run_cancel_tasks()
    settings.MONITOR_PENDING_SECONDS = 0
    stranded_checks()["jobs"]()
    assert not Job.objects.filter(automation=automation, status=Job.Status.PENDING).exists()


def rerun_racing(deactivate) -> tuple:
    """Re-runs of a finished job racing ``deactivate(person, automation, admin)``: the
    person, the job's automation and every answer."""
    person = UserFactory()
    automation = AutomationWithWorkerFactory()
    job = finished_job(person, automation)
    admin = PlatformAdminFactory()
    answers = rerun_together(
        person,
        job,
        RERUNNERS,
        beside=once_re_runs_are_made(job, lambda: deactivate(person, automation, admin)),
    )
    return automation, answers


def test_re_runs_racing_the_automations_deactivation_are_created_or_refused(settings):
    automation, answers = rerun_racing(
        lambda person, automation, admin: automation_deactivate(
            automation_id=automation.id, actor=admin
        )
    )

    assert set(Counter(status for status, _ in answers)) == {201, 409}
    refusals = {body["error"]["code"] for status, body in answers if status == 409}
    assert refusals <= {"automation_inactive"}
    assert_no_pending_job_is_left_behind(settings, automation)


def test_re_runs_racing_the_tenants_deactivation_are_created_or_refused(settings):
    automation, answers = rerun_racing(
        lambda person, automation, admin: tenant_deactivate(tenant=person.tenant, actor=admin)
    )

    # Refused as the request is authenticated (the tenant found inactive), or by the
    # service (found inactive after that): never a 500.
    statuses = set(Counter(status for status, _ in answers))
    assert 201 in statuses and statuses <= {201, 401, 403, 409}, answers
    refusals = {body["error"]["code"] for status, body in answers if status == 409}
    assert refusals <= {"tenant_inactive"}
    assert_no_pending_job_is_left_behind(settings, automation)
