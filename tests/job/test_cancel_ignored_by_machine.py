"""A cancellation ends a running job even when its machine keeps heartbeating and never
stops: after the cancel, heartbeats extend the lease for a bounded time only, and the
monitor ends the job ``canceled`` when that runs out.

A worker learns of the cancellation at its next heartbeat (a third of a lease), stops its
command and reports. One that goes on beating instead (a machine whose command cannot be
stopped, a worker of its own making) would otherwise hold the job running for ever, and
the person's cancel would never take effect.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from job.management.commands.watch_stuck_jobs import Command
from job.models import Job
from job.services import job_cancel
from tests.factories import JobFactory
from tests.job.support import events_of, heartbeat

pytestmark = pytest.mark.django_db

LEASE = 60


@pytest.fixture
def running(worker, worker_api, settings):
    settings.JOB_LEASE_SECONDS = LEASE
    job = JobFactory(automation=worker.automation)
    assert worker_api.post(f"/api/v1/jobs/{job.id}/start").status_code == 200
    job.refresh_from_db()
    return job


def test_a_machine_beating_on_after_a_cancel_cannot_keep_the_job_running(worker_api, running, user):
    asked = timezone.now()
    job_cancel(tenant=running.tenant, job_id=running.id, actor=user)
    answers = []
    # The machine beats every third of a lease for ten minutes, never stopping.
    for beat in range(1, 31):
        with time_machine.travel(asked + timedelta(seconds=beat * LEASE / 3), tick=False):
            answers.append(heartbeat(worker_api, running).status_code)
            Command().settle_lost_jobs()

    running.refresh_from_db()
    assert running.status == Job.Status.CANCELED
    assert running.failure_reason == Job.FailureReason.CANCELED
    # Ended within the bound: two leases after the cancel, and a lease of the last beat.
    assert running.finished_at <= asked + timedelta(seconds=3 * LEASE + LEASE / 3)
    assert answers[0] == 200 and answers[-1] == 409
    assert events_of(running.id) == ["JobStarted", "JobCanceled"]


def test_a_worker_that_stops_in_time_reports_its_end_itself(worker_api, running, user):
    asked = timezone.now()
    job_cancel(tenant=running.tenant, job_id=running.id, actor=user)
    with time_machine.travel(asked + timedelta(seconds=LEASE / 3), tick=False):
        beat = heartbeat(worker_api, running)
        assert beat.json()["cancel_requested"] is True
    with time_machine.travel(asked + timedelta(seconds=LEASE), tick=False):
        Command().settle_lost_jobs()
        report = worker_api.post(
            f"/api/v1/jobs/{running.id}/fail",
            {"claim_token": str(running.claim_token), "error": "canceled"},
            format="json",
        )

    assert report.status_code == 200, report.content
    assert report.json()["status"] == "canceled"


def test_heartbeats_without_a_cancel_keep_the_job_running(worker_api, running):
    start = timezone.now()
    for beat in range(1, 31):
        with time_machine.travel(start + timedelta(seconds=beat * LEASE / 3), tick=False):
            assert heartbeat(worker_api, running).status_code == 200
            Command().settle_lost_jobs()

    running.refresh_from_db()
    assert running.status == Job.Status.RUNNING


def test_a_beat_after_the_cancel_never_shortens_the_lease_the_monitor_renewed(
    worker_api, running, user
):
    asked = timezone.now()
    job_cancel(tenant=running.tenant, job_id=running.id, actor=user)
    # The hub was down for an hour: the monitor gives every running job a fresh lease.
    later = asked + timedelta(hours=1)
    renewed = later + timedelta(seconds=LEASE)
    Job.objects.filter(pk=running.pk).update(lease_expires_at=renewed)

    with time_machine.travel(later + timedelta(seconds=1), tick=False):
        beat = heartbeat(worker_api, running)

    assert beat.status_code == 200, beat.content
    assert beat.json()["cancel_requested"] is True
    running.refresh_from_db()
    assert running.lease_expires_at == renewed
