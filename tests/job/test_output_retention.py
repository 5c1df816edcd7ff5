"""A finished job's log is kept JOB_OUTPUT_RETENTION_DAYS after its end, then deleted in
bounded batches (``job.retention``); a pending or running job's log stays whatever its age."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from job.models import Job, JobOutputChunk
from job.retention import BATCH_SIZE, job_output_delete_expired, job_output_expired_chunks
from job.selectors import job_output_page
from tests.factories import JobFactory, RunningJobFactory
from tests.plans import plan_of, rows_read

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def retention(settings):
    settings.JOB_OUTPUT_RETENTION_DAYS = 30


def finished(
    *,
    days_ago: float,
    status: str = Job.Status.SUCCEEDED,
    ran: timedelta = timedelta(hours=1),
    **fields,
) -> Job:
    """A job that ran for ``ran`` and finished ``days_ago`` days ago."""
    end = timezone.now() - days_ago * DAY
    return JobFactory(
        status=status,
        attempt=1,
        failure_reason="" if status == Job.Status.SUCCEEDED else Job.FailureReason.ERROR,
        created_at=end - ran,
        started_at=end - ran,
        finished_at=end,
        output_tail="the end\n",
        **fields,
    )


def log(job: Job, *, chunks: int = 3, days_ago: float | None = None) -> None:
    """``chunks`` chunks of output, sent ``days_ago`` days ago (by default, while it ran)."""
    sent = (
        timezone.now() - days_ago * DAY
        if days_ago is not None
        else (job.started_at or job.created_at)
    )
    JobOutputChunk.objects.bulk_create(
        JobOutputChunk(
            job=job,
            attempt=1,
            seq=n,
            offset=n * 5,
            text=f"line{n}",
            created_at=sent + timedelta(seconds=n),
        )
        for n in range(chunks)
    )


def stored(job: Job) -> int:
    return JobOutputChunk.objects.filter(job=job).count()


def test_the_logs_of_jobs_finished_longer_than_the_retention_ago_are_deleted():
    succeeded = finished(days_ago=31)
    failed = finished(days_ago=45, status=Job.Status.FAILED)
    canceled = finished(days_ago=400, status=Job.Status.CANCELED)
    for job in (succeeded, failed, canceled):
        log(job)

    assert job_output_delete_expired() == 9

    for job in (succeeded, failed, canceled):
        assert stored(job) == 0
        job.refresh_from_db()  # the job stays, and with it the end of its output
        assert job.output_tail == "the end\n"
    page = job_output_page(job=succeeded, offset=0, limit=100)
    assert (page.text, page.finished) == ("", True)


def test_a_job_finished_within_the_retention_keeps_its_log_however_old_its_chunks():
    # Ran for 40 days, finished 29 days ago: its chunks are past the cutoff, its end is not.
    job = finished(days_ago=29, ran=40 * DAY)
    log(job)
    old = finished(days_ago=31)
    log(old)

    assert job_output_delete_expired() == 3

    assert stored(job) == 3 and stored(old) == 0


def test_a_running_or_pending_job_keeps_its_log_whatever_its_age():
    running = RunningJobFactory(started_at=timezone.now() - 400 * DAY)
    log(running, days_ago=400)
    # Back to pending after a lost worker, its first attempt's log a year old; and one
    # whose finished_at was left behind by hand: the status decides, not the date.
    pending = JobFactory(attempt=1, created_at=timezone.now() - 400 * DAY)
    log(pending, days_ago=399)
    stray = JobFactory(attempt=1, finished_at=timezone.now() - 300 * DAY)
    log(stray, days_ago=301)

    assert job_output_delete_expired() == 0

    assert (stored(running), stored(pending), stored(stray)) == (3, 3, 3)


def test_a_call_deletes_at_most_its_bound_and_the_next_one_goes_on():
    jobs = [finished(days_ago=31 + n) for n in range(5)]
    for job in jobs:
        log(job, chunks=5)

    with CaptureQueriesContext(connection) as queries:
        assert job_output_delete_expired(batch_size=4, batches=3) == 12
    deletes = [q["sql"] for q in queries if q["sql"].startswith("DELETE")]
    assert len(deletes) == 3
    assert JobOutputChunk.objects.count() == 13
    # The oldest go first: the job that finished first has nothing left.
    assert stored(jobs[-1]) == 0 and stored(jobs[0]) == 5

    assert job_output_delete_expired(batch_size=4, batches=3) == 12
    # One left, and a batch that comes back short ends the call: nothing more is due.
    with CaptureQueriesContext(connection) as queries:
        assert job_output_delete_expired(batch_size=4, batches=3) == 1
    assert len([q for q in queries if q["sql"].startswith("DELETE")]) == 1
    assert job_output_delete_expired(batch_size=4, batches=3) == 0


def test_the_retention_counts_days_from_the_jobs_end(settings):
    settings.JOB_OUTPUT_RETENTION_DAYS = 7
    recent, old = finished(days_ago=6.9), finished(days_ago=7.1)
    log(recent)
    log(old)

    assert job_output_delete_expired() == 3

    assert stored(recent) == 3 and stored(old) == 0


def test_a_retention_of_0_keeps_every_log_forever(settings):
    settings.JOB_OUTPUT_RETENTION_DAYS = 0
    job = finished(days_ago=3650)
    log(job)

    with CaptureQueriesContext(connection) as queries:
        assert job_output_delete_expired() == 0

    assert stored(job) == 3 and len(queries) == 0


def test_the_sweep_walks_only_the_expired_chunks_by_their_age():
    """60 days of history (20,000 jobs, 100,000 chunks), half of it past the retention: a
    batch reads its chunks from the index of their age and each one's job by its key,
    not the table, nor the jobs of the last 30 days."""
    with connection.cursor() as cursor:
        job = finished(days_ago=0)  # a tenant, automation and person to own the history
        cursor.execute(
            """
            WITH history AS (
                INSERT INTO jobs (tenant_id, automation_id, requested_by_id, status, params,
                                  attempt, error, failure_reason, output_tail, created_at,
                                  started_at, finished_at, updated_at)
                SELECT %(tenant)s, %(automation)s, %(user)s, 'succeeded', '{}'::jsonb, 1,
                       '', '', '', at, at, at + interval '1 minute', at + interval '1 minute'
                  FROM generate_series(1, 20000) AS n,
                       LATERAL (SELECT now() - (20000 - n) * interval '259 seconds' AS at) AS t
                RETURNING id, started_at
            )
            INSERT INTO job_output_chunks (job_id, attempt, seq, "offset", text, created_at)
            SELECT id, 1, s, s * 10, 'some line', started_at + s * interval '1 second'
              FROM history, generate_series(0, 4) AS s
            """,
            {"tenant": job.tenant_id, "automation": job.automation_id, "user": job.requested_by_id},
        )
        cursor.execute("ANALYZE jobs")
        cursor.execute("ANALYZE job_output_chunks")
    before = timezone.now() - 30 * DAY
    batch = job_output_expired_chunks(before=before).values("pk")[:BATCH_SIZE]

    indexes, read = rows_read(plan_of(batch))

    assert "job_output_chunks_created_idx" in indexes
    assert indexes <= {"job_output_chunks_created_idx", "jobs_pkey"}
    # The batch's chunks and their jobs, read once each (what a scan of either table,
    # 100,000 or 20,000 rows, would far exceed).
    assert read <= 2 * BATCH_SIZE + 10
