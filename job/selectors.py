"""Reads of jobs, for this module's API and for other modules."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from job.models import Job, JobOutputChunk, JobStatus

# A job's public shape, in order: what the job API answers and a webhook's body carries.
PUBLIC_FIELDS = (
    "id",
    "automation",
    "status",
    "params",
    "requested_by",
    "triggered_by",
    "rerun_of",
    "attempt",
    "created_at",
    "started_at",
    "finished_at",
    "last_heartbeat_at",
    "cancel_requested",
    "cancel_requested_at",
    "progress",
    "result",
    "error",
    "failure_reason",
    "exit_code",
    "output_tail",
    "updated_at",
)


def job_public(job: Job) -> dict[str, Any]:
    """The job as the outside sees it, ready for JSON: the job API's body
    (``job.api.serializers.JobOutput`` documents it) and the ``job`` of a webhook's.

    Times in ISO 8601, UTC with a ``Z``; ids of the automation, the requester and the job
    it re-runs, not objects; ``failure_reason`` null unless the job failed.
    """
    return {
        "id": job.id,
        "automation": job.automation_id,
        "status": job.status,
        "params": job.params,
        "requested_by": job.requested_by_id,
        "triggered_by": job.triggered_by,
        "rerun_of": job.rerun_of_id,
        "attempt": job.attempt,
        "created_at": _time(job.created_at),
        "started_at": _time(job.started_at),
        "finished_at": _time(job.finished_at),
        "last_heartbeat_at": _time(job.last_heartbeat_at),
        "cancel_requested": job.cancel_requested,
        "cancel_requested_at": _time(job.cancel_requested_at),
        "progress": job.progress,
        "result": job.result,
        "error": job.error,
        "failure_reason": job.failure_reason or None,
        "exit_code": job.exit_code,
        "output_tail": job.output_tail,
        "updated_at": _time(job.updated_at),
    }


def _time(value: datetime | None) -> str | None:
    # As the API has always written them (DRF's ISO 8601): in the current time zone
    # (UTC), "+00:00" written "Z".
    if value is None:
        return None
    text = timezone.localtime(value).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


def job_list(
    *,
    tenant: Any,
    statuses: list[str] | None = None,
    automation_id: int | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
) -> QuerySet[Job]:
    """A tenant's jobs, newest first (served by ``jobs_tenant_recent_idx``)."""
    queryset = Job.objects.filter(tenant=tenant)
    if statuses:
        queryset = queryset.filter(status__in=statuses)
    if automation_id is not None:
        queryset = queryset.filter(automation_id=automation_id)
    if created_after is not None:
        queryset = queryset.filter(created_at__gte=created_after)
    if created_before is not None:
        queryset = queryset.filter(created_at__lt=created_before)
    return queryset.order_by("-created_at", "-id")


def job_traceparent(job_id: int) -> str:
    """The trace a job is (the W3C traceparent of what began it), for the hub's own work
    about a job its events named; "" when there is no such job or it keeps no trace."""
    found = Job.objects.filter(pk=job_id).values_list("traceparent", flat=True)
    return found.first() or ""


def job_get(*, tenant: Any, job_id: int) -> Job | None:
    """One of the tenant's jobs; another tenant's job is as absent as a missing one."""
    return Job.objects.filter(tenant=tenant, pk=job_id).first()


def jobs_pending_for(*, automation_id: int, limit: int) -> list[Job]:
    """The worker's poll: the automation's pending jobs, oldest first.

    Reads only what ``jobs_pending_poll_idx`` holds, so it is an index-only scan.
    """
    return list(
        Job.objects.filter(automation_id=automation_id, status=JobStatus.PENDING)
        .order_by("created_at", "id")
        .only("id", "automation_id", "created_at")[:limit]
    )


def running_count(*, automation_id: int) -> int:
    return Job.objects.filter(automation_id=automation_id, status=JobStatus.RUNNING).count()


# --- the stuck-job monitor ----------------------------------------------------------------


def automations_with_jobs_pending_before(cutoff: datetime) -> list[int]:
    """The automations with a job pending since before ``cutoff``, by id.

    A pending job's ``updated_at`` is when it became pending: its creation, or the
    requeue that put it back after a lost worker (nothing else touches a pending job).
    It is never before ``created_at``, so the condition on ``created_at`` is implied and
    only there to walk ``jobs_pending_poll_idx``.
    """
    return list(
        Job.objects.filter(status=JobStatus.PENDING, created_at__lt=cutoff, updated_at__lt=cutoff)
        .order_by("automation_id")
        .values_list("automation_id", flat=True)
        .distinct()
    )


def oldest_traceparent(*, automation_id: int, status: str, before: datetime | None = None) -> str:
    """The trace of the automation's oldest job in ``status`` (since before ``before``):
    what the hub does again for the automation's waiting jobs continues the trace of the
    one that has waited longest. "" when it has none, or keeps no trace."""
    jobs = Job.objects.filter(automation_id=automation_id, status=status)
    if before is not None:
        jobs = jobs.filter(created_at__lt=before, updated_at__lt=before)
    return jobs.order_by("created_at", "id").values_list("traceparent", flat=True).first() or ""


def jobs_pending_of(
    *, automation_ids: list[int], tenant_ids: list[int], pending_before: datetime, limit: int
) -> list[int]:
    """Jobs pending since before ``pending_before`` of any of these automations or tenants,
    oldest first, by id (at most ``limit``).

    One query per list, each on its own index (``jobs_pending_poll_idx`` for automations,
    ``jobs_tenant_status_recent_idx`` for tenants); ``created_at`` is implied by
    ``updated_at`` (see above) and there for the index.
    """
    found: set[int] = set()
    for column, ids in (("automation_id", automation_ids), ("tenant_id", tenant_ids)):
        if not ids:
            continue
        found.update(
            Job.objects.filter(
                status=JobStatus.PENDING,
                created_at__lt=pending_before,
                updated_at__lt=pending_before,
                **{f"{column}__in": ids},
            )
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
    return sorted(found)[:limit]


def job_ids_unfinished_of(
    *, automation_id: int | None = None, tenant_id: int | None = None, after: int, limit: int
) -> list[int]:
    """Pending and running jobs of one automation or one tenant with an id above ``after``,
    in id order (at most ``limit``): a walk through them, one page at a time. One query per
    status, so that each reads its own index."""
    scope = (
        {"automation_id": automation_id} if automation_id is not None else {"tenant_id": tenant_id}
    )
    found: list[int] = []
    for status in (JobStatus.PENDING, JobStatus.RUNNING):
        found += (
            Job.objects.filter(status=status, pk__gt=after, **scope)
            .order_by("id")
            .values_list("id", flat=True)[:limit]
        )
    return sorted(found)[:limit]


def jobs_with_expired_lease(*, now: datetime, limit: int = 1000) -> list[int]:
    """Running jobs whose lease expired by ``now``, oldest expiry first, by id.

    The running set is small (bounded by the automations' limits); ``jobs_running_idx``
    holds exactly it.
    """
    return list(
        Job.objects.filter(status=JobStatus.RUNNING, lease_expires_at__lte=now)
        .order_by("lease_expires_at", "id")
        .values_list("id", flat=True)[:limit]
    )


def automation_has_work(automation_id: int) -> bool:
    """Whether the automation has a pending or running job now (each status through its
    own partial index, as ``automation_ids_with_work``)."""
    return any(
        Job.objects.filter(automation_id=automation_id, status=status).exists()
        for status in (JobStatus.PENDING, JobStatus.RUNNING)
    )


def automation_ids_with_work() -> set[int]:
    """Automations with a pending or running job: their machines must stay up.

    One query per status, so that each reads its own partial index (a ``status IN``
    would match neither index's condition and scan the whole history).
    """
    return {
        automation_id
        for status in (JobStatus.PENDING, JobStatus.RUNNING)
        for automation_id in Job.objects.filter(status=status)
        .order_by()
        .values_list("automation_id", flat=True)
        .distinct()
    }


@dataclass(frozen=True)
class OutputPage:
    offset: int
    next_offset: int
    # The log's first offset still stored: what came before was deleted (0: nothing was).
    dropped_before: int
    text: str
    # The job ended and this page reached the end of its log: no more will come.
    finished: bool

    @property
    def dropped(self) -> int:
        """Characters asked for (from ``offset``) that were deleted before this read."""
        return max(0, self.dropped_before - self.offset)


def output_page_public(job: Job, page: OutputPage) -> dict[str, Any]:
    """A page of the job's log as its readers get it (the API and the admin alike)."""
    return {
        "job": job.pk,
        "status": job.status,
        "offset": page.offset,
        "next_offset": page.next_offset,
        "dropped_before": page.dropped_before,
        "text": page.text,
        "finished": page.finished,
    }


def job_output_page(*, job: Job, offset: int, limit: int) -> OutputPage:
    """At most ``limit`` characters of the job's log from ``offset`` (or from its first
    stored character, when those before were deleted)."""
    chunks = JobOutputChunk.objects.filter(job=job)
    first = chunks.order_by("offset").values_list("offset", flat=True).first() or 0
    start = max(offset, first)
    pieces: list[str] = []
    size = 0
    # The chunk holding ``start`` begins at most JOB_OUTPUT_CHUNK_MAX_CHARS before it, as
    # does any chunk sent when that limit was higher: look at every chunk from the one
    # before the window's start (the index job_output_chunks_offset_idx).
    holding = (
        chunks.filter(offset__lte=start)
        .order_by("-offset")
        .values_list("offset", flat=True)
        .first()
    )
    window = chunks.filter(offset__gte=holding if holding is not None else start)
    for chunk_offset, text in window.order_by("offset").values_list("offset", "text").iterator():
        if chunk_offset + len(text) <= start:
            continue
        piece = text[max(0, start + size - chunk_offset) :][: limit - size]
        pieces.append(piece)
        size += len(piece)
        if size >= limit:
            break
    newest = chunks.order_by("-offset").values_list("offset", "text").first()
    log_end = newest[0] + len(newest[1]) if newest else 0
    next_offset = start + size
    return OutputPage(
        offset=offset,
        next_offset=next_offset,
        dropped_before=first,
        text="".join(pieces),
        finished=job.is_finished and next_offset >= log_end,
    )


def job_output_last(*, job: Job, chars: int) -> OutputPage:
    """The last ``chars`` characters of the job's stored log (the admin's job page)."""
    newest = (
        JobOutputChunk.objects.filter(job=job).order_by("-offset").values_list("offset", "text")
    ).first()
    end = newest[0] + len(newest[1]) if newest else 0
    return job_output_page(job=job, offset=max(0, end - chars), limit=chars)
