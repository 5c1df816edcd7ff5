"""How long a finished job's log is kept: ``JOB_OUTPUT_RETENTION_DAYS`` after its end.

A job's log is bounded (``JOB_OUTPUT_MAX_CHARS``) but the jobs are not: without an end, the
chunks of every job ever run would stay. The stuck-job monitor calls
``job_output_delete_expired`` (``watch_stuck_jobs``), which deletes the chunks of the jobs
that finished longer than the retention ago. A pending or running job's chunks stay
whatever their age: its log is still being written, or read by someone waiting for its end.
The job itself, and its ``output_tail`` (the end of the output, its report's), stay too.

Each statement deletes a bounded batch in its own transaction, and a call runs a bounded
number of them: no lock is held long and no call runs unbounded; what is left, the next
call deletes. A finished job's log never changes again (only a running job's worker sends
output), so deleting it races with nothing but a reader, who finds it gone.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from job.models import FINISHED, JobOutputChunk

# Chunks deleted per statement (one short transaction each), and statements per call. At
# the monitor's pace (a call a minute, or every cycle while a backlog lasts) that is some
# fourteen million chunks a day, far more than the jobs send.
BATCH_SIZE = 1000
BATCHES_PER_CALL = 10


def job_output_expired_chunks(*, before: datetime):
    """The chunks of jobs that finished before ``before``, oldest first.

    Found from the chunks' side (job_output_chunks_created_idx), each one's job by its
    key: a chunk is stored while its job runs, so a job that finished before ``before``
    has only chunks older than that. What the walk reads and keeps are the chunks of jobs
    that started before ``before`` and have not finished since: few, those of jobs running
    (or pending again) for longer than the retention.
    """
    return JobOutputChunk.objects.filter(
        created_at__lt=before,
        job__status__in=FINISHED,
        job__finished_at__lt=before,
    ).order_by("created_at")


def job_output_delete_expired(
    *,
    now: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    batches: int = BATCHES_PER_CALL,
) -> int:
    """Delete the chunks of jobs finished more than ``JOB_OUTPUT_RETENTION_DAYS`` ago, at
    most ``batch_size`` a statement and ``batches`` statements. Returns how many went.

    No transaction around the batches: each statement commits alone, so a call holds the
    locks of one batch at a time. With a retention of 0, nothing is ever deleted.
    """
    days = settings.JOB_OUTPUT_RETENTION_DAYS
    if days == 0:
        return 0
    before = (now or timezone.now()) - timedelta(days=days)
    deleted = 0
    for _ in range(batches):
        batch = job_output_expired_chunks(before=before).values("pk")[:batch_size]
        # No model points at a chunk and no signal listens for its deletion: Django
        # deletes these with one DELETE ... WHERE id IN (the batch), loading none.
        count, _ = JobOutputChunk.objects.filter(pk__in=batch).delete()
        deleted += count
        if count < batch_size:
            break  # nothing more is due right now
    return deleted
