"""Many jobs nobody asked for in person (a scheduler's due times), created together.

``jobs_create_many`` does for each request what ``job_create`` does for one (the checks
first, then the pending job and its JobCreated event with its outbox rows), in a few
statements for all of them: one INSERT of the jobs, two for their events and runs. The rows
go as columns (``common.columns``), not a model instance's values one by one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from common import tracing
from common.columns import insert_sql
from common.context import get_correlation_id
from common.errors import Conflict, DomainError
from job.metrics import JOB_TRANSITIONS
from job.models import Job, JobStatus
from job.services import job_params_check
from outbox.services import Occurrence, publish_many


@dataclass(frozen=True)
class JobRequest:
    """One job to create: ``automation`` is the automation's row as the caller read it
    (its ``is_active`` and ``params_schema`` are what the job is checked against).

    ``params_checked``: the caller checked the parameters against that schema already
    (``params_refusal``), before it locked what the jobs are for, and ``params_refusal``
    is what the check found; they are not checked again here."""

    tenant_id: int
    automation: Any
    params: dict[str, Any]
    triggered_by: dict[str, Any] | None = None
    params_checked: bool = False
    params_refusal: DomainError | None = None


def params_refusal(
    params: dict[str, Any], *, schema: dict[str, Any] | None, automation_id: int
) -> DomainError | None:
    """The refusal ``params`` meet against an automation's parameter ``schema``, or None.
    It runs a tenant's schema (up to ``JOB_PARAMS_VALIDATION_SECONDS``): callers make it
    before they lock anything."""
    try:
        job_params_check(params, schema=schema, automation_id=automation_id)
    except DomainError as refusal:
        return refusal
    return None


def jobs_create_many(requests: Sequence[JobRequest]) -> list[Job | DomainError]:
    """Create a pending job per request and record its JobCreated. Returns, in the
    requests' order, the job, or the refusal ``job_create`` would have raised for that
    request (an inactive automation, params its schema refuses): a refused request writes
    nothing and keeps none of the others from being created."""
    outcomes: list[Job | DomainError] = []
    # The same params against the same schema (one schedule's catch-up runs) are checked once.
    checked: dict[tuple[int, str], DomainError | None] = {}
    now = timezone.now()
    correlation_id = get_correlation_id()
    # Nobody's request began these jobs: each begins a trace of its own (its JobCreated's
    # rows, the machine's claim and report continue it), not one trace for the batch.
    roots: list[tracing.Span] = []
    for request in requests:
        key = (request.automation.pk, json.dumps(request.params, sort_keys=True, default=str))
        if key not in checked:
            checked[key] = _refusal(request)
        refusal = checked[key]
        if refusal is None and tracing.active():
            roots.append(_root(request))
        outcomes.append(
            refusal
            if refusal is not None
            else Job(
                tenant_id=request.tenant_id,
                automation_id=request.automation.pk,
                requested_by=None,
                params=request.params,
                triggered_by=request.triggered_by,
                created_at=now,
                updated_at=now,
                traceparent=tracing.traceparent_of(roots[-1]) if roots else "",
                correlation_id=correlation_id,
            )
        )
    jobs = [outcome for outcome in outcomes if isinstance(outcome, Job)]
    if not jobs:
        return outcomes
    try:
        # No savepoint of its own (two round trips): a failure here fails the caller's
        # block, which undoes the batch (the firing's set, in its savepoint).
        with transaction.atomic(savepoint=False):
            _insert(jobs, now=now, correlation_id=correlation_id)
            publish_many(
                Occurrence(
                    event.name,
                    event.payload,
                    aggregate=job,
                    tenant=job.tenant_id,
                    traceparent=job.traceparent or None,
                )
                for job in jobs
                for event in (job.created_event(),)
            )
            # One count for the batch, when it commits (``count_transition`` per job would
            # register as many callbacks).
            transaction.on_commit(
                lambda: JOB_TRANSITIONS.labels(to=JobStatus.PENDING).inc(len(jobs))
            )
    finally:
        for job, root in zip(jobs, roots, strict=False):
            if job.pk is not None:
                root.set_attribute("hubdommed.job_id", job.pk)
            root.end()
    return outcomes


def _root(request: JobRequest) -> tracing.Span:
    return tracing.begin_trace(
        "schedule.fire",
        attributes={
            "hubdommed.tenant_id": request.tenant_id,
            "hubdommed.automation_id": request.automation.pk,
        },
    )


def _insert(jobs: list[Job], *, now, correlation_id: str) -> None:
    """One INSERT for every job, a parameter a column (``common.columns``); each job gets
    its id."""
    sql, params = insert_sql(
        Job,
        {
            "tenant_id": [job.tenant_id for job in jobs],
            "automation_id": [job.automation_id for job in jobs],
            "params": [job.params for job in jobs],
            "triggered_by": [job.triggered_by for job in jobs],
            "traceparent": [job.traceparent for job in jobs],
        },
        same={
            "created_at": now,
            "updated_at": now,
            "correlation_id": correlation_id,
        },
    )
    with connection.cursor() as cursor:
        cursor.execute(f'{sql} RETURNING "id"', params)
        # The rows are inserted in the order of the arrays, each taking the sequence's next
        # id as it goes: sorted, the ids are the jobs', in order, whatever order RETURNING
        # gives them in.
        for job, job_id in zip(
            jobs, sorted(job_id for (job_id,) in cursor.fetchall()), strict=True
        ):
            job.pk = job_id
            job._state.adding = False


def _refusal(request: JobRequest) -> DomainError | None:
    automation = request.automation
    if not automation.is_active:
        return Conflict("The automation is inactive.", code="automation_inactive")
    if request.params_checked:
        return request.params_refusal
    return params_refusal(
        request.params, schema=automation.params_schema, automation_id=automation.pk
    )
