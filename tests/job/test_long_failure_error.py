"""A failure report whose error is longer than the hub keeps is cut, not refused.

A refused report is final for the worker (it forgets the outcome), so refusing a long
error would leave the job running until its lease ran out, and then fail it as
``worker_lost`` or run it again: the failure the machine reported would be lost.
"""

from __future__ import annotations

import pytest

from job.api.serializers import FAILURE_ERROR_MAX_CHARS
from job.models import Job
from tests.factories import JobFactory
from tests.job.support import events_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def running(worker, worker_api):
    job = JobFactory(automation=worker.automation)
    assert worker_api.post(f"/api/v1/jobs/{job.id}/start").status_code == 200
    job.refresh_from_db()
    return job


def fail(worker_api, job, **body):
    return worker_api.post(
        f"/api/v1/jobs/{job.id}/fail", {"claim_token": str(job.claim_token), **body}, format="json"
    )


def test_an_error_over_the_limit_is_cut_and_the_failure_recorded(worker_api, running):
    error = "e" * FAILURE_ERROR_MAX_CHARS + "the rest"

    response = fail(worker_api, running, error=error, exit_code=2)

    assert response.status_code == 200, response.content
    running.refresh_from_db()
    assert running.status == Job.Status.FAILED
    assert running.failure_reason == Job.FailureReason.EXIT_CODE
    assert running.error == "e" * FAILURE_ERROR_MAX_CHARS
    assert events_of(running.id) == ["JobStarted", "JobFailed"]


def test_the_cut_report_sent_again_is_the_same_report(worker_api, running):
    error = "\u00e9" * (FAILURE_ERROR_MAX_CHARS + 5)
    assert fail(worker_api, running, error=error).status_code == 200

    again = fail(worker_api, running, error=error)

    assert again.status_code == 200, again.content
    assert events_of(running.id) == ["JobStarted", "JobFailed"]


def test_an_error_with_unstorable_characters_past_the_limit_is_still_taken(worker_api, running):
    error = "\u0000" * (FAILURE_ERROR_MAX_CHARS * 2)

    response = fail(worker_api, running, error=error)

    assert response.status_code == 200, response.content
    running.refresh_from_db()
    assert running.error == "\ufffd" * FAILURE_ERROR_MAX_CHARS
