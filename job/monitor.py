"""The stuck-job monitor's sweeps over jobs (``watch_stuck_jobs`` runs them each cycle).

Not use cases someone asks for, as ``job.services`` holds, but the hub's own rescue of
jobs nothing else would move: a running job whose worker stopped heartbeating is settled
(``job_settle_lost``), every running job gets a fresh lease after an outage of the hub,
and the machines of automations whose jobs wait too long are powered on or restarted.
Each is one transaction, and goes through the job's transitions like the use cases do.
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from datetime import datetime, timedelta
from enum import StrEnum

from django.db import transaction
from django.utils import timezone

from automation.selectors import automation_get, automations_with_silent_workers
from common import tracing
from job.metrics import RETRIED
from job.models import Job, JobStatus, MonitorCycle
from job.selectors import automations_with_jobs_pending_before, oldest_traceparent
from job.services import (
    count_transition,
    lease_length,
    record_transition,
    save_transition,
)
from outbox.services import dispatch

logger = logging.getLogger("hubdommed.job")

# The task that powers an automation's machine on (subscribed to JobCreated, in tasks.json).
POWER_ON_TASK = "machines.power_on"
# The task that restarts it (tasks.json).
RESTART_TASK = "machines.restart"


class Settlement(StrEnum):
    """What ``job_settle_lost`` did with a job."""

    FAILED = "failed"  # failed with worker_lost, JobFailed recorded
    CANCELED = "canceled"  # a cancellation was pending: the job ends canceled
    REQUEUED = "requeued"  # back to pending for another attempt; the machine powered on again
    ALIVE = "alive"  # a heartbeat arrived in time after all: left alone
    SKIPPED = "skipped"  # not running any more, or someone else holds the row right now


WORKER_LOST_ERROR = "The worker stopped heartbeating: its lease expired at {expired}."
OUT_OF_TIME_ERROR = (
    "The job ran past its automation's time limit of {limit} s and its worker did not "
    "report: its lease expired at {expired}."
)


def job_settle_lost(*, job_id: int) -> Settlement:
    """Settle a running job whose lease expired: its worker is gone.

    The lease is checked again under the row lock, so a heartbeat that committed since
    the job was listed wins. SKIP LOCKED: a row held by a heartbeat, a report or another
    monitor is left to its holder; the next cycle sees what came of it, so two monitors
    never settle one job twice.

    When the automation allows another attempt (``max_attempts`` above the job's
    ``attempt``, the automation active, no cancellation asked) the job goes back to
    pending and ``machines.power_on`` is dispatched again for it; no event (the next
    start records JobStarted with the new attempt). Otherwise it fails with
    ``worker_lost`` and JobFailed is recorded, by the system.
    """
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",), skip_locked=True)
            .filter(pk=job_id, status=JobStatus.RUNNING)
            .first()
        )
        if job is None:
            return Settlement.SKIPPED
        now = timezone.now()
        if not job.lease_expired(now=now):
            return Settlement.ALIVE
        automation = automation_get(job.automation_id)
        # Past its time limit, the job failed for its time, not for a lost worker: another
        # attempt would run as long.
        out_of_time = automation is not None and job.ran_out_of_time(
            time_limit=timedelta(seconds=automation.timeout_seconds), now=now
        )
        if (
            automation is not None
            and automation.is_active
            and automation.max_attempts > job.attempt
            and not job.cancel_requested
            and not out_of_time
        ):
            job.requeue(now=now)
            save_transition(job, was=JobStatus.RUNNING)
            count_transition(job, to=RETRIED)
            # The job's next attempt is part of its trace, as its first was.
            with tracing.maybe_span(
                "monitor.requeue",
                traceparent=job.traceparent or None,
                attributes={"hubdommed.job_id": job.pk, "hubdommed.attempt": job.attempt},
            ):
                dispatch(
                    POWER_ON_TASK, {"automation_id": int(job.automation_id)}, tenant=job.tenant_id
                )
            outcome = Settlement.REQUEUED
        else:
            expired = job.lease_expires_at.isoformat()
            if out_of_time:
                reason = Job.FailureReason.TIMEOUT
                error = OUT_OF_TIME_ERROR.format(limit=automation.timeout_seconds, expired=expired)
            else:
                reason = Job.FailureReason.WORKER_LOST
                error = WORKER_LOST_ERROR.format(expired=expired)
            event = job.fail(reason=reason, now=now, error=error)
            save_transition(job, was=JobStatus.RUNNING)
            record_transition(job, event, actor="system")
            outcome = Settlement(job.status)
    logger.info("job %s: worker lost (attempt %s), %s", job_id, job.attempt, outcome)
    return outcome


def jobs_renew_leases_after_outage(*, interval: float, margin: float) -> int:
    """Give every running job a whole fresh lease if the monitor's previous cycle ended
    more than ``interval + margin`` seconds ago. Returns how many leases were renewed.

    A gap like that means the monitor was down, and with it, most likely, the hub: the
    workers could not heartbeat, and settling their jobs now would fail them for the
    hub's own outage. Their leases start again from now instead (never shortened); a
    worker that is really gone is found when the new lease runs out. No record at all
    (the monitor's first cycle ever) says nothing about an outage: nothing is renewed.
    """
    with transaction.atomic():
        cycle = (
            MonitorCycle.objects.select_for_update().filter(name=MonitorCycle.STUCK_JOBS).first()
        )
        now = timezone.now()
        if cycle is None or now - cycle.ended_at <= timedelta(seconds=interval + margin):
            return 0
        renewed_until = now + lease_length()
        renewed = Job.objects.filter(
            status=JobStatus.RUNNING, lease_expires_at__lt=renewed_until
        ).update(lease_expires_at=renewed_until, updated_at=now)
        # A worker that stopped with the hub (make run's Ctrl-C stops local machines) left
        # its outcome on its machine's disk: powered on again (idempotent), it reports it.
        running_on = (
            Job.objects.filter(status=JobStatus.RUNNING)
            .order_by()
            .values_list("automation_id", flat=True)
            .distinct()
        )
        for automation_id in running_on:
            with _in_trace_of_oldest(automation_id, JobStatus.RUNNING, "monitor.power_on"):
                dispatch(POWER_ON_TASK, {"automation_id": int(automation_id)})
    logger.warning(
        "monitor: no cycle for %.0f s (the hub was down?): %s running jobs get a fresh lease",
        (now - cycle.ended_at).total_seconds(),
        renewed,
    )
    return renewed


def monitor_cycle_ended() -> None:
    """Record that a cycle of the stuck-job monitor just ended."""
    MonitorCycle.objects.update_or_create(
        name=MonitorCycle.STUCK_JOBS, defaults={"ended_at": timezone.now()}
    )


@transaction.atomic
def jobs_restart_silent_workers(*, silent_since: datetime) -> list[int]:
    """Dispatch ``machines.restart`` for the automations with a job pending since before
    ``silent_since`` whose worker has not been heard from since then either. Returns
    their ids.

    A worker that runs polls the hub every few seconds: one silent that long while jobs
    wait crashed, hung, or holds a credential that was rotated. The task restarts its
    machine unless the worker speaks up meanwhile.
    """
    automation_ids = automations_with_silent_workers(
        automations_with_jobs_pending_before(silent_since), silent_since=silent_since
    )
    for automation_id in automation_ids:
        with _in_trace_of_oldest(
            automation_id, JobStatus.PENDING, "monitor.restart", before=silent_since
        ):
            dispatch(
                RESTART_TASK,
                {"automation_id": int(automation_id), "silent_since": silent_since.isoformat()},
            )
    return automation_ids


@transaction.atomic
def jobs_resend_power_on(*, pending_before: datetime) -> list[int]:
    """Dispatch ``machines.power_on`` again, once per automation, for the automations
    with a job pending since before ``pending_before``. Returns their ids.

    On the platform outbox: it is the hub's own initiative, not one tenant's request.
    An inactive automation's machine is not powered on (its jobs wait for nothing).
    """
    automation_ids = [
        automation_id
        for automation_id in automations_with_jobs_pending_before(pending_before)
        if automation_get(automation_id, active_only=True) is not None
    ]
    for automation_id in automation_ids:
        with _in_trace_of_oldest(
            automation_id, JobStatus.PENDING, "monitor.power_on", before=pending_before
        ):
            dispatch(POWER_ON_TASK, {"automation_id": int(automation_id)})
    return automation_ids


def _in_trace_of_oldest(
    automation_id: int, status: str, name: str, *, before: datetime | None = None
) -> AbstractContextManager[object]:
    """A span in the trace of the automation's job that has waited longest: the machine
    the monitor powers on (or restarts) for its jobs is part of that job's story. Nothing
    is read while tracing is off."""
    if not tracing.active():
        return nullcontext()
    traceparent = oldest_traceparent(automation_id=automation_id, status=status, before=before)
    return tracing.span(
        name, traceparent=traceparent or None, attributes={"hubdommed.automation_id": automation_id}
    )
