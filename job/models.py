"""The job: one execution of an automation, from the request to its end.

The ``Job`` aggregate owns its transitions (``start``, ``heartbeat``, ``complete``,
``fail``, ``request_cancel``, ``requeue``). Each checks the current state first,
raises ``Conflict`` with a stable code when the move is illegal, changes the
instance in memory and returns the domain event it causes (or ``None`` when the
call repeats what already happened). ``job.services`` locks the row, calls the
transition, saves and records the event in one transaction. A re-run is no transition:
the job only says whether it may be run again (``check_rerun``), and the re-run is a
new job that names it (``rerun_of``).

The machine's final states are ``FINISHED``; ``WAYS_FORWARD`` says what moves each other
state (docs/state-machines.md), and ``job.stranded`` is the monitor's check that no job
is left without it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.utils import timezone

from common.errors import Conflict
from common.models import choices_check
from outbox.models import jsonb_typeof_is


class JobStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


FINISHED = (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED)

# What moves a job in each state that is not final. Nothing else may leave a job there.
WAYS_FORWARD = {
    JobStatus.PENDING: (
        "the automation's worker takes it (the JobCreated message on its own queue, or its "
        "poll); the monitor powers its machine on again while it waits "
        "(MONITOR_PENDING_SECONDS) and restarts a silent worker; a deactivation of its "
        "automation or tenant cancels it (the job.cancel_deactivated task, and the "
        "monitor's check of stranded jobs as the net)"
    ),
    JobStatus.RUNNING: (
        "its worker's report; its lease (JOB_LEASE_SECONDS, extended by heartbeats; the "
        "jobs_running_has_claim_check constraint keeps every running job with one): once "
        "expired, the monitor fails it worker_lost, or requeues it when max_attempts allows; "
        "once a cancellation is asked, heartbeats extend it to two leases after it at most, "
        "and the monitor ends it canceled; past its automation's timeout_seconds, to a lease "
        "after that at most, and the monitor fails it timeout"
    ),
}


class FailureReason(models.TextChoices):
    ERROR = "error"  # the worker reported an error
    EXIT_CODE = "exit_code"  # the command ended with a non-zero exit code
    TIMEOUT = "timeout"  # the command ran past the automation's timeout
    WORKER_LOST = "worker_lost"  # the lease expired: the worker stopped heartbeating
    CANCELED = "canceled"  # the worker stopped because a cancellation was requested


@dataclass(frozen=True)
class JobEvent:
    """A domain event a transition caused, to be recorded with it."""

    name: str
    payload: dict[str, Any] = field(default_factory=dict)


class Job(models.Model):
    Status = JobStatus
    FailureReason = FailureReason

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("identity.Tenant", on_delete=models.PROTECT, related_name="+")
    automation = models.ForeignKey(
        "automation.Automation", on_delete=models.PROTECT, related_name="+"
    )
    # Null only for jobs the hub starts itself (a schedule's); people always leave their name.
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    # What started a job the hub started itself: {"schedule": id, "due_at": iso} for a
    # schedule's run (null for a person's request).
    triggered_by = models.JSONField(null=True, blank=True)
    # The finished job this one runs again (POST /jobs/{id}/rerun); null for any other.
    # PROTECT, not SET_NULL: where a re-run came from is part of its history, and the
    # hub deletes no job, so a deletion that would erase it is refused rather than
    # silently leaving the re-run without its origin. No db_index: jobs_rerun_of_idx
    # below holds only the re-runs.
    rerun_of = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,
    )
    status = models.TextField(choices=JobStatus.choices, default=JobStatus.PENDING)
    params = models.JSONField(default=dict)
    # The caller's Idempotency-Key: a retried request returns the job it created.
    idempotency_key = models.TextField(null=True, blank=True)
    # How many times the job was claimed (1 on the first start).
    attempt = models.PositiveIntegerField(default=0)
    # The current claim: only the worker holding it may heartbeat and report. Kept after
    # the end so that a repeated report can be recognized.
    claim_token = models.UUIDField(null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    progress = models.JSONField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True, default="")
    failure_reason = models.TextField(choices=FailureReason.choices, blank=True, default="")
    exit_code = models.IntegerField(null=True, blank=True)
    # The end of the command's output (the last JOB_OUTPUT_TAIL_MAX_CHARS characters).
    output_tail = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    last_heartbeat_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(default=timezone.now)
    # The W3C traceparent of the request that created the job (empty while tracing is off):
    # its worker's poll and claim answer with it, so that a job found by the poll alone is
    # claimed, run and reported in the trace of its creation (common.tracing).
    traceparent = models.TextField(
        blank=True,
        default="",
        # Rows written by hand (a bulk load, a raw INSERT) need not name it.
        db_default="",
        help_text=(
            "The W3C traceparent of the request that created the job, for the worker's "
            "requests about it (empty while the hub's tracing is off)."
        ),
    )
    # The correlation id (X-Request-ID) of the request that created the job, for the same
    # reason: a job found by the poll alone is claimed and reported under it.
    correlation_id = models.TextField(
        blank=True,
        default="",
        db_default="",
        help_text=(
            "The correlation id of the request that created the job (X-Request-ID), for "
            "the worker's requests about it."
        ),
    )

    class Meta:
        db_table = "jobs"
        constraints = [
            choices_check("jobs", "status", JobStatus),
            models.CheckConstraint(
                condition=Q(failure_reason="") | Q(failure_reason__in=FailureReason.values),
                name="jobs_failure_reason_check",
            ),
            models.CheckConstraint(
                condition=jsonb_typeof_is("params", "object"), name="jobs_params_check"
            ),
            # A running job always has a claim and a lease: the worker-lost monitor relies on it.
            models.CheckConstraint(
                condition=~Q(status=JobStatus.RUNNING)
                | Q(claim_token__isnull=False, lease_expires_at__isnull=False),
                name="jobs_running_has_claim_check",
            ),
            # job_create catches the violation of this one to answer a concurrent retry.
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=Q(idempotency_key__isnull=False),
                name="jobs_tenant_idempotency_key_key",
            ),
        ]
        indexes = [
            # GET /jobs: a tenant's jobs newest first, keyset-paginated on (created_at, id);
            # with no filter, or only created_after / created_before (a range of it).
            models.Index(
                F("tenant"), F("created_at").desc(), F("id").desc(), name="jobs_tenant_recent_idx"
            ),
            # GET /jobs?status=: the same order within one status, so a page of a rare
            # status (failed, pending) reads its 50 rows instead of skipping every newer
            # job of the others.
            models.Index(
                F("tenant"),
                F("status"),
                F("created_at").desc(),
                F("id").desc(),
                name="jobs_tenant_status_recent_idx",
            ),
            # GET /jobs?automation=: the same order within one automation.
            models.Index(
                F("tenant"),
                F("automation"),
                F("created_at").desc(),
                F("id").desc(),
                name="jobs_tenant_auto_recent_idx",
            ),
            # The worker's poll: an automation's pending jobs, oldest first. Partial, so it
            # holds only what waits, however long the history grows.
            models.Index(
                fields=["automation", "created_at", "id"],
                condition=Q(status=JobStatus.PENDING),
                name="jobs_pending_poll_idx",
            ),
            # The claim counts an automation's running jobs (index-only on this one). The
            # running set is small (bounded by the automations' limits), so the stuck-job
            # monitor can walk all of it here too.
            models.Index(
                fields=["automation"],
                condition=Q(status=JobStatus.RUNNING),
                name="jobs_running_idx",
            ),
            # A job's re-runs (the admin's link from a job's page to them). Partial: most
            # jobs are no re-run, and the history does not grow this index.
            models.Index(
                fields=["rerun_of"],
                condition=Q(rerun_of__isnull=False),
                name="jobs_rerun_of_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.pk} ({self.status})"

    @property
    def is_finished(self) -> bool:
        return self.status in FINISHED

    @property
    def cancel_requested(self) -> bool:
        return self.cancel_requested_at is not None

    def lease_expired(self, *, now: datetime) -> bool:
        """A running job whose worker has not heartbeaten within its lease."""
        return (
            self.status == JobStatus.RUNNING
            and self.lease_expires_at is not None
            and self.lease_expires_at <= now
        )

    def ran_out_of_time(self, *, time_limit: timedelta, now: datetime) -> bool:
        """A running job started ``time_limit`` or longer ago."""
        return (
            self.status == JobStatus.RUNNING
            and self.started_at is not None
            and self.started_at + time_limit <= now
        )

    # --- events -----------------------------------------------------------------------

    def _event(self, name: str, **extra: Any) -> JobEvent:
        # job_id and automation_id are ints: the automation's own queue is routed by them.
        # A job not yet written has no id: its JobCreated takes it as it is written
        # (``outbox.services.publish_new``).
        job_id = None if self.pk is None else int(self.pk)
        return JobEvent(name, {"job_id": job_id, "automation_id": int(self.automation_id), **extra})

    def created_event(self) -> JobEvent:
        return self._event(
            "JobCreated",
            tenant_id=int(self.tenant_id),
            requested_by=self.requested_by_id,
            rerun_of=self.rerun_of_id,
            created_at=self.created_at.isoformat(),
        )

    def check_rerun(self) -> None:
        """Only a finished job may be run again (as a new job): a pending or running one
        is still on its way, and running it twice at once is not what anyone asked."""
        if not self.is_finished:
            raise Conflict(
                "The job has not finished; only a finished job can be run again.",
                code="job_not_finished",
                details={"status": self.status},
            )

    # --- transitions ------------------------------------------------------------------

    def start(
        self,
        *,
        worker: Any,
        lease: timedelta,
        now: datetime,
        running: int,
        max_concurrency: int,
        claim_token: uuid.UUID | None = None,
    ) -> JobEvent:
        """The claim: ``running`` is the automation's count of running jobs, read under
        the automation's claim lock, so the limit holds whatever the interleaving. The
        token is the worker's own when it names its claim (``job.services.job_claim``)."""
        if self.status == JobStatus.RUNNING:
            raise Conflict("Another worker already claimed this job.", code="already_claimed")
        if self.status != JobStatus.PENDING:
            raise Conflict(
                "The job is not pending.", code="not_pending", details={"status": self.status}
            )
        if running >= max_concurrency:
            raise Conflict(
                "The automation is running as many jobs as it may at once.",
                code="concurrency_limit",
                details={"running": running, "max_concurrency": max_concurrency},
            )
        self.status = JobStatus.RUNNING
        self.attempt += 1
        self.claim_token = claim_token or uuid.uuid4()
        self.started_at = now
        self.last_heartbeat_at = now
        self.lease_expires_at = now + lease
        self.progress = None
        return self._event(
            "JobStarted",
            worker_id=int(worker.pk),
            attempt=self.attempt,
            lease_expires_at=self.lease_expires_at.isoformat(),
        )

    def check_claim(self, claim_token: uuid.UUID) -> None:
        """Only the worker holding the current claim may act on the job."""
        if self.claim_token is None or self.claim_token != claim_token:
            raise Conflict(
                "This claim is not the job's current claim.",
                code="stale_claim",
            )

    def heartbeat(
        self,
        *,
        claim_token: uuid.UUID,
        lease: timedelta,
        now: datetime,
        progress: Any = None,
        time_limit: timedelta | None = None,
    ) -> None:
        """The claim's lease extended by ``lease`` from ``now``, up to the job's ends.

        Two ends bound it, so that a machine that beats on and never reports cannot keep
        the job running: a cancellation (the worker learns of it at this beat, within a
        third of a lease, and stops: a lease more is its time to stop and report) and the
        automation's ``time_limit`` from the start (the worker stops its command there and
        reports: a lease more, again). Past an end, beats extend the lease no further, nor
        shorten it (one the monitor renewed after an outage stays): the monitor ends the
        job when it runs out, ``canceled`` or failed ``timeout``.
        """
        self.check_claim(claim_token)
        self._require_running()
        self.last_heartbeat_at = now
        ends = [now + lease]
        if self.cancel_requested:
            ends.append(self.cancel_requested_at + 2 * lease)
        if time_limit is not None and self.started_at is not None:
            ends.append(self.started_at + time_limit + lease)
        if len(ends) == 1:
            self.lease_expires_at = ends[0]
        else:
            self.lease_expires_at = max(self.lease_expires_at or now, min(ends))
        if progress is not None:
            self.progress = progress

    def check_output(self, claim_token: uuid.UUID) -> None:
        """Only the worker holding the current claim sends output, while the job runs."""
        self.check_claim(claim_token)
        self._require_running()

    def complete(
        self,
        *,
        claim_token: uuid.UUID,
        result: Any,
        now: datetime,
        output_tail: str = "",
        exit_code: int | None = None,
    ) -> JobEvent | None:
        """The worker's success report, with the command's exit code and output tail."""
        self.check_claim(claim_token)
        if (
            self.status == JobStatus.SUCCEEDED
            and self.result == result
            and self.exit_code == exit_code
        ):
            return None  # the same report again (a retried request)
        self._require_running()
        self.status = JobStatus.SUCCEEDED
        self.result = result
        self.output_tail = output_tail
        self.exit_code = exit_code
        self._finish(now)
        return self._event("JobCompleted", attempt=self.attempt, exit_code=exit_code)

    def fail(
        self,
        *,
        reason: str,
        now: datetime,
        error: str = "",
        output_tail: str = "",
        exit_code: int | None = None,
        claim_token: uuid.UUID | None = None,
    ) -> JobEvent | None:
        """A worker's failure report (with its ``claim_token``), or the hub's own verdict
        (``claim_token=None``: the stuck-job monitor's ``worker_lost``).

        When a cancellation was requested the job ends ``canceled``: the worker stopped
        because it was asked to.
        """
        if claim_token is not None:
            self.check_claim(claim_token)
            if (
                self.status in (JobStatus.FAILED, JobStatus.CANCELED)
                and self.failure_reason in (reason, FailureReason.CANCELED)
                and self.error == error
                and self.exit_code == exit_code
            ):
                return None  # the same report again (not a verdict the hub reached alone)
        self._require_running()
        self.error = error
        self.output_tail = output_tail
        self.exit_code = exit_code
        self._finish(now)
        if self.cancel_requested:
            self.status = JobStatus.CANCELED
            self.failure_reason = FailureReason.CANCELED
            return self._event("JobCanceled", attempt=self.attempt, was=JobStatus.RUNNING.value)
        self.status = JobStatus.FAILED
        self.failure_reason = reason
        return self._event(
            "JobFailed", attempt=self.attempt, failure_reason=reason, exit_code=exit_code
        )

    def request_cancel(self, *, now: datetime, reason: str = "") -> JobEvent | None:
        """A pending job is canceled at once; a running one is marked, and its worker
        learns it at its next heartbeat. Asking again changes nothing.

        ``reason`` is the hub's own, when it cancels (its automation or tenant was
        deactivated): a job canceled at once keeps it in ``error``, and its event says it.
        """
        if self.status == JobStatus.PENDING:
            self.status = JobStatus.CANCELED
            self.cancel_requested_at = now
            self.failure_reason = FailureReason.CANCELED
            self.finished_at = now
            self.error = reason
            return self._event(
                "JobCanceled",
                attempt=self.attempt,
                was=JobStatus.PENDING.value,
                **({"reason": reason} if reason else {}),
            )
        if self.status == JobStatus.RUNNING:
            if self.cancel_requested_at is None:
                self.cancel_requested_at = now
            return None
        if self.status == JobStatus.CANCELED:
            return None
        raise self._already_finished()

    def requeue(self, *, now: datetime) -> None:
        """Put a running job whose worker was lost back in the queue for another attempt.

        No event: the job is pending again as it was after JobCreated, and its next
        start records JobStarted with the new attempt number.
        """
        self._require_running()
        self.status = JobStatus.PENDING
        self.claim_token = None
        self.lease_expires_at = None
        self.started_at = None
        self.last_heartbeat_at = None
        self.progress = None

    def _require_running(self) -> None:
        if self.status == JobStatus.RUNNING:
            return
        if self.is_finished:
            raise self._already_finished()
        raise Conflict(
            "The job is not running.", code="not_running", details={"status": self.status}
        )

    def _already_finished(self) -> Conflict:
        return Conflict(
            "The job has already finished.",
            code="already_finished",
            details={"status": self.status},
        )

    def _finish(self, now: datetime) -> None:
        self.finished_at = now
        self.lease_expires_at = None


class MonitorCycle(models.Model):
    """When a daemon last finished a cycle: how the stuck-job monitor tells that it (and
    so, most likely, the hub) was down, from the gap before its next cycle."""

    STUCK_JOBS = "stuck_jobs"

    name = models.TextField(primary_key=True)
    ended_at = models.DateTimeField()

    class Meta:
        db_table = "monitor_cycles"

    def __str__(self) -> str:
        return f"{self.name} ended {self.ended_at.isoformat()}"


class JobOutputChunk(models.Model):
    """A piece of a running job's output, as its worker sent it (POST /jobs/{id}/output).

    A job's log is its chunks in ``offset`` order, over all its attempts. Offsets only grow
    (the next chunk starts where the newest ends), so a reader's offset stays valid when
    the oldest chunks are deleted to keep the log within JOB_OUTPUT_MAX_CHARS.
    """

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="+", db_index=False)
    attempt = models.PositiveIntegerField()
    # The worker's number of the chunk within the attempt (0, 1, 2...): a retried chunk
    # is recognized by it and stored once.
    seq = models.PositiveIntegerField()
    # Characters of the job's log before this chunk (including those since deleted).
    offset = models.BigIntegerField()
    text = models.TextField()
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "job_output_chunks"
        constraints = [
            # job_output_append recognizes a retried chunk by it.
            models.UniqueConstraint(
                fields=["job", "attempt", "seq"], name="job_output_chunks_seq_unique"
            ),
        ]
        indexes = [
            # The reader's pages and the append's newest chunk.
            models.Index(fields=["job", "offset"], name="job_output_chunks_offset_idx"),
            # The retention sweep (job.retention): the oldest chunks first. A chunk is
            # stored while its job runs, so it is older than the job's end; the sweep
            # walks only those older than its cutoff, and what it deletes it never reads
            # again, however long the history of finished jobs grows.
            models.Index(fields=["created_at"], name="job_output_chunks_created_idx"),
        ]

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} chunk {self.seq}"

    @property
    def end(self) -> int:
        return self.offset + len(self.text)
