"""The outbox's reads for the admin's console: read-only.

The front page's figures: the backlog counts and dates the unsent rows (the tables' partial
pending indexes serve it); the failing runs are the task runs an operator must look at
(failed: only a person starts them again; retrying: on their way back, failing so far).
Then the links between a job, its events and its runs, read from the envelopes: a run
whose outbox row was purged since (maintenance.purge) is linked to nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db.models import Count, Min, Q

from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun, TaskRunStatus


@dataclass(frozen=True)
class Backlog:
    """One outbox table's unsent rows."""

    table: str
    pending: int
    # The oldest unsent row's creation (None: nothing waits).
    oldest_created_at: datetime | None
    # Of the pending, how many are due already (the others wait for a delay or a backoff).
    due: int


def outbox_backlogs(*, now: datetime) -> list[Backlog]:
    """The tenant outbox's backlog, then the platform outbox's."""
    backlogs = []
    for model in (OutboxMessage, PlatformOutboxMessage):
        pending = model.objects.filter(sent_at__isnull=True)
        figures = pending.aggregate(pending=Count("id"), oldest=Min("created_at"))
        backlogs.append(
            Backlog(
                table=model._meta.db_table,
                pending=figures["pending"],
                oldest_created_at=figures["oldest"],
                due=pending.filter(available_at__lte=now).count() if figures["pending"] else 0,
            )
        )
    return backlogs


def task_runs_failing() -> dict[str, int]:
    """How many task runs are failed and how many retrying."""
    counted = dict(
        TaskRun.objects.filter(status__in=(TaskRunStatus.FAILED, TaskRunStatus.RETRYING))
        .values_list("status")
        .annotate(n=Count("run_id"))
        .values_list("status", "n")
    )
    return {
        status: counted.get(status, 0) for status in (TaskRunStatus.FAILED, TaskRunStatus.RETRYING)
    }


def run_payloads(run_ids: list) -> dict[str, dict]:
    """The payload each run's outbox row carried, by run id (a row purged since: absent)."""
    found: dict[str, dict] = {}
    for model in (OutboxMessage, PlatformOutboxMessage):
        for run_id, envelope in model.objects.filter(run_id__in=run_ids).values_list(
            "run_id", "envelope"
        ):
            payload = envelope.get("payload") if isinstance(envelope, dict) else None
            found[str(run_id)] = payload if isinstance(payload, dict) else {}
    return found


def job_event_ids(job_id: int) -> list[int]:
    """The ids of a job's events in the trail, oldest first."""
    return list(
        Event.objects.filter(aggregate_type="Job", aggregate_id=str(job_id))
        .order_by("id")
        .values_list("pk", flat=True)
    )


def job_correlation_id(job_id: int) -> str:
    """The correlation id of the request that created the job (its first event's)."""
    return (
        Event.objects.filter(aggregate_type="Job", aggregate_id=str(job_id))
        .order_by("id")
        .values_list("correlation_id", flat=True)
        .first()
        or ""
    )


def job_run_ids(job_id: int) -> list:
    """The task runs a job caused: those of its events' subscribers, and those whose payload
    names it."""
    event_ids = job_event_ids(job_id)
    run_ids: list = []
    for model in (OutboxMessage, PlatformOutboxMessage):
        rows = model.objects.filter(
            Q(envelope__event_id__in=event_ids) | Q(envelope__payload__job_id=job_id)
        )
        run_ids.extend(rows.values_list("run_id", flat=True))
    return run_ids


def run_job_ids(run_ids: list) -> dict[str, int]:
    """The job each run is about, by run id: its payload's ``job_id``, or the job whose
    event it subscribed to."""
    envelopes: dict[str, dict] = {}
    for model in (OutboxMessage, PlatformOutboxMessage):
        for run_id, envelope in model.objects.filter(run_id__in=run_ids).values_list(
            "run_id", "envelope"
        ):
            envelopes[str(run_id)] = envelope if isinstance(envelope, dict) else {}
    event_ids = {
        e.get("event_id") for e in envelopes.values() if isinstance(e.get("event_id"), int)
    }
    of_jobs = dict(
        Event.objects.filter(pk__in=event_ids, aggregate_type="Job").values_list(
            "pk", "aggregate_id"
        )
    )
    found = {}
    for run_id, envelope in envelopes.items():
        payload = envelope.get("payload") if isinstance(envelope.get("payload"), dict) else {}
        job_id = payload.get("job_id")
        if not isinstance(job_id, int) and envelope.get("event_id") in of_jobs:
            job_id = int(of_jobs[envelope["event_id"]])
        if isinstance(job_id, int) and not isinstance(job_id, bool):
            found[run_id] = job_id
    return found


def event_job_ids(event_ids: list[int]) -> dict[int, int]:
    """The job each event is about, by event id (events of other aggregates: absent)."""
    return {
        pk: int(aggregate_id)
        for pk, aggregate_id in Event.objects.filter(
            pk__in=event_ids, aggregate_type="Job"
        ).values_list("pk", "aggregate_id")
    }
