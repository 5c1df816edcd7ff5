"""After the hub was down, running jobs get a whole lease to be heard from again.

The monitor records the end of each cycle; a cycle that starts much later than the
interval (the monitor, and so most likely the hub, was down) gives every running job a
fresh lease instead of failing it as ``worker_lost``: its worker could not heartbeat.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from job.models import Job, MonitorCycle
from job.monitor import Settlement

pytestmark = pytest.mark.django_db


def last_cycle_ended(seconds_ago: float) -> None:
    MonitorCycle.objects.update_or_create(
        name=MonitorCycle.STUCK_JOBS,
        defaults={"ended_at": timezone.now() - timedelta(seconds=seconds_ago)},
    )


def test_after_an_outage_running_jobs_get_a_fresh_lease_not_worker_lost(monitor, lost, settings):
    settings.JOB_LEASE_SECONDS = 60
    monitor.interval = 30
    job = lost()
    last_cycle_ended(10 * 60)  # the whole hub was down for ten minutes

    counts = monitor.run_cycle()

    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    assert counts.settled[Settlement.FAILED] == 0 and counts.leases_renewed == 1
    remaining = (job.lease_expires_at - timezone.now()).total_seconds()
    assert 50 < remaining <= 60
    # The next cycle, on time, leaves it alone until that lease runs out too.
    monitor.run_cycle()
    job.refresh_from_db()
    assert job.status == Job.Status.RUNNING
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now())
    assert monitor.run_cycle().settled[Settlement.FAILED] == 1


def test_cycles_on_time_settle_lost_workers_as_before(monitor, lost):
    monitor.interval = 30
    job = lost()
    last_cycle_ended(20)

    counts = monitor.run_cycle()

    assert counts.settled[Settlement.FAILED] == 1 and counts.leases_renewed == 0
    job.refresh_from_db()
    assert job.failure_reason == Job.FailureReason.WORKER_LOST


def test_a_fresh_lease_never_shortens_a_longer_one(monitor, settings):
    from tests.factories import RunningJobFactory

    settings.JOB_LEASE_SECONDS = 60
    monitor.interval = 30
    far = timezone.now() + timedelta(minutes=30)
    job = RunningJobFactory(started_at=timezone.now(), lease_expires_at=far)
    last_cycle_ended(10 * 60)

    monitor.run_cycle()

    job.refresh_from_db()
    assert job.lease_expires_at == far


@pytest.mark.parametrize(("gap", "renewed"), [(32, 0), (40, 1)])
def test_a_gap_past_the_interval_and_a_few_seconds_is_an_outage(monitor, lost, gap, renewed):
    monitor.interval = 30
    lost()
    last_cycle_ended(gap)

    assert monitor.run_cycle().leases_renewed == renewed
