"""Step 5: the monitor deletes the logs of jobs finished past JOB_OUTPUT_RETENTION_DAYS, at
most once a minute (every cycle while a backlog lasts), and a failing sweep stops nothing."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from job.management.commands import watch_stuck_jobs
from job.management.commands.watch_stuck_jobs import OUTPUT_SWEEP_SECONDS
from job.models import Job, JobOutputChunk, MonitorCycle
from tests.factories import JobFactory
from tests.observability.conftest import sample

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def retention(settings):
    settings.JOB_OUTPUT_RETENTION_DAYS = 30


def expired_log(chunks: int = 3) -> Job:
    """A job finished 40 days ago, and its log."""
    end = timezone.now() - timedelta(days=40)
    job = JobFactory(status=Job.Status.SUCCEEDED, attempt=1, started_at=end, finished_at=end)
    JobOutputChunk.objects.bulk_create(
        JobOutputChunk(job=job, attempt=1, seq=n, offset=n, text="x", created_at=end)
        for n in range(chunks)
    )
    return job


def stored() -> int:
    return JobOutputChunk.objects.count()


def test_a_cycle_deletes_the_expired_logs_and_counts_them(monitor, caplog):
    caplog.set_level("INFO", logger="hubdommed.monitor")
    expired_log(), expired_log()
    before = sample("hubdommed_job_output_chunks_deleted_total")

    counts = monitor.run_cycle()

    assert counts.output_chunks_deleted == 6 and counts.errors == 0
    assert stored() == 0
    assert sample("hubdommed_job_output_chunks_deleted_total") == before + 6
    assert "; 6 output chunks deleted past their retention" in caplog.text


def test_the_sweep_runs_at_most_once_a_minute(monitor):
    expired_log()
    assert monitor.delete_expired_output() == 3
    expired_log()

    assert monitor.delete_expired_output() == 0
    assert stored() == 3

    monitor.output_swept_at = time.monotonic() - OUTPUT_SWEEP_SECONDS - 1
    assert monitor.delete_expired_output() == 3
    assert stored() == 0


def test_a_sweep_that_deleted_all_it_may_runs_again_on_the_next_cycle(monitor):
    monitor.output_batch_size, monitor.output_batches = 2, 2
    expired_log(chunks=9)

    assert [monitor.delete_expired_output() for _ in range(4)] == [4, 4, 1, 0]
    assert stored() == 0
    # The short sweep ended the backlog: the next waits its minute.
    expired_log()
    assert monitor.delete_expired_output() == 0


def test_a_failing_sweep_is_logged_and_the_cycle_goes_on(monitor, lost, caplog, monkeypatch):
    job = lost()
    expired_log()
    calls = []

    def broken(**bounds):
        calls.append(bounds)
        raise RuntimeError("the sweep broke")

    monkeypatch.setattr(watch_stuck_jobs, "job_output_delete_expired", broken)
    errors = sample("hubdommed_monitor_step_errors_total", step="delete_expired_output")

    counts = monitor.run_cycle()

    assert counts.errors == 1 and counts.output_chunks_deleted == 0
    assert "monitor step delete_expired_output failed" in caplog.text
    assert "the sweep broke" in caplog.text
    assert sample("hubdommed_monitor_step_errors_total", step="delete_expired_output") == (
        errors + 1
    )
    # The steps before it did their work, and the cycle's end was recorded.
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED
    assert MonitorCycle.objects.filter(name=MonitorCycle.STUCK_JOBS).exists()
    assert stored() == 3
    # A failed sweep waits its turn too, rather than failing every cycle.
    assert monitor.run_cycle().errors == 0 and len(calls) == 1
