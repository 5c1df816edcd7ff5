"""An automation's time limit (``timeout_seconds``) ends its job even when the machine
keeps heartbeating and never reports: past the limit, heartbeats extend the lease for a
lease more only, and the monitor then fails the job ``timeout``.

The worker stops its command at the limit and reports it itself. One whose command cannot
be stopped, or whose report never comes while its beats do (a worker of its own making,
a wedged agent), would otherwise hold the job running for ever, and a slot of the
automation's ``max_concurrency`` with it.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from job.management.commands.watch_stuck_jobs import Command
from job.models import Job
from tests.factories import JobFactory
from tests.job.support import events_of, heartbeat

pytestmark = pytest.mark.django_db

LEASE = 60
LIMIT = 120


@pytest.fixture
def running(worker, worker_api, settings):
    settings.JOB_LEASE_SECONDS = LEASE
    automation = worker.automation
    automation.timeout_seconds = LIMIT
    automation.max_attempts = 3
    automation.save(update_fields=["timeout_seconds", "max_attempts"])
    job = JobFactory(automation=automation)
    assert worker_api.post(f"/api/v1/jobs/{job.id}/start").status_code == 200
    job.refresh_from_db()
    return job


def test_a_machine_beating_on_past_the_time_limit_cannot_keep_the_job_running(worker_api, running):
    answers = []
    # The machine beats every third of a lease for ten minutes and never reports.
    for beat in range(1, 31):
        with time_machine.travel(
            running.started_at + timedelta(seconds=beat * LEASE / 3), tick=False
        ):
            answers.append(heartbeat(worker_api, running).status_code)
            Command().settle_lost_jobs()

    running.refresh_from_db()
    # Failed for its time, not requeued: another attempt would run as long.
    assert running.status == Job.Status.FAILED
    assert running.failure_reason == Job.FailureReason.TIMEOUT
    assert f"time limit of {LIMIT} s" in running.error
    assert running.attempt == 1
    # Ended within the bound: the limit, a lease to report, and a beat's lateness.
    assert running.finished_at <= running.started_at + timedelta(seconds=LIMIT + LEASE + LEASE / 3)
    assert answers[0] == 200 and answers[-1] == 409
    assert events_of(running.id) == ["JobStarted", "JobFailed"]


def test_a_worker_reporting_its_own_timeout_within_the_grace_is_heard(worker_api, running):
    past_the_limit = running.started_at + timedelta(seconds=LIMIT + LEASE / 2)
    with time_machine.travel(past_the_limit, tick=False):
        assert heartbeat(worker_api, running).status_code == 200
        Command().settle_lost_jobs()
        report = worker_api.post(
            f"/api/v1/jobs/{running.id}/fail",
            {
                "claim_token": str(running.claim_token),
                "error": f"timed out after {LIMIT} s",
                "reason": "timeout",
            },
            format="json",
        )

    assert report.status_code == 200, report.content
    running.refresh_from_db()
    assert running.status == Job.Status.FAILED
    assert running.error == f"timed out after {LIMIT} s"


def test_a_worker_lost_before_the_limit_is_still_requeued(worker_api, running):
    with time_machine.travel(running.started_at + timedelta(seconds=LEASE + 1), tick=False):
        Command().settle_lost_jobs()

    running.refresh_from_db()
    assert running.status == Job.Status.PENDING


def test_a_limit_lowered_while_the_job_runs_never_shortens_a_lease_already_given(
    worker_api, running
):
    with time_machine.travel(running.started_at + timedelta(seconds=LEASE / 3), tick=False):
        assert heartbeat(worker_api, running).status_code == 200
    running.refresh_from_db()
    given = running.lease_expires_at
    running.automation.timeout_seconds = 1
    running.automation.save(update_fields=["timeout_seconds"])

    with time_machine.travel(running.started_at + timedelta(seconds=LEASE / 2), tick=False):
        assert heartbeat(worker_api, running).status_code == 200

    running.refresh_from_db()
    assert running.lease_expires_at == given
