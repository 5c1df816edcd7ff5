"""Use cases of jobs: each one transaction, with the events it causes.

Every transition loads the job with its row locked, lets the aggregate check and
change it, saves it and records the event on the tenant's outbox before the
commit. The claim also takes the automation's claim lock first, so that the
count of running jobs it compares with the limit cannot change under it.

The hub's own rescue of stuck jobs (the monitor's sweeps) is ``job.monitor``.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from automation.params_schema import TooCostly, UnusableSchema, params_errors
from automation.selectors import (
    JobTerms,
    automation_get,
    automation_id_on_terms,
    automation_time_limit,
)
from automation.services import worker_seen
from common import tracing
from common.context import get_correlation_id
from common.errors import Conflict, DomainError, InvalidInput, NotFound
from identity.selectors import tenant_is_active
from job import automation_terms, live
from job.metrics import count_claim_refusal, count_transition_on_commit
from job.models import Job, JobEvent, JobOutputChunk, JobStatus
from job.selectors import (
    job_get,
    job_ids_unfinished_of,
    running_count,
)
from outbox.services import publish, publish_new

logger = logging.getLogger("hubdommed.job")

# Advisory-lock namespace of job claims (the first key of pg_advisory_xact_lock(int, int)).
CLAIM_LOCK_NAMESPACE = 0x6A6F62  # "job"

# Columns a transition may change; saved together by one conditional UPDATE.
_STATE_FIELDS = (
    "status",
    "attempt",
    "claim_token",
    "lease_expires_at",
    "cancel_requested_at",
    "progress",
    "result",
    "error",
    "failure_reason",
    "exit_code",
    "output_tail",
    "started_at",
    "finished_at",
    "last_heartbeat_at",
)


def lease_length() -> timedelta:
    return timedelta(seconds=settings.JOB_LEASE_SECONDS)


# --- people -----------------------------------------------------------------------------


def job_create(
    *,
    tenant: Any,
    automation_id: int,
    params: dict[str, Any],
    requested_by: Any,
    idempotency_key: str | None = None,
    triggered_by: dict[str, Any] | None = None,
    rerun_of: Job | None = None,
) -> tuple[Job, bool]:
    """Create a pending job and record JobCreated. Returns ``(job, created)``.

    ``triggered_by`` names what started a job nobody asked for (a schedule's due time);
    ``rerun_of`` the finished job this one runs again (``job_rerun``).

    With an ``idempotency_key`` already used by the tenant, returns that job and
    ``created=False`` (when the request is the same one; another request is refused).

    The checks come before the transaction (checking the parameters against the
    automation's schema may take a while), against the automation's terms as this process
    last read them (``job.automation_terms``); the transaction holds only the writes, the
    job, its event, its runs and its outbox rows in one statement (``_write_created``), and
    that statement writes them only if the automation still has those terms. When it no
    longer has them, the job is checked again against its terms of now, and written on
    them or refused as they say.
    """
    if idempotency_key is not None:
        existing = Job.objects.filter(tenant=tenant, idempotency_key=idempotency_key).first()
        if existing is not None:
            return _replayed(existing, automation_id, params, rerun_of), False

    terms = _terms_accepting(automation_id, params)
    now = timezone.now()
    job = Job(
        tenant=tenant,
        automation_id=terms.automation_id,
        requested_by=requested_by,
        params=params,
        idempotency_key=idempotency_key,
        triggered_by=triggered_by,
        rerun_of=rerun_of,
        created_at=now,
        updated_at=now,
        traceparent=tracing.current_traceparent() or "",
        correlation_id=get_correlation_id(),
    )
    for _ in range(_WRITES_ON_CHANGED_TERMS):
        try:
            with transaction.atomic():
                if idempotency_key is None:
                    _write_created(job, terms, actor=requested_by)
                else:
                    existing = _write_unless_key_taken(job, terms, actor=requested_by)
                    if existing is not None:
                        return _replayed(existing, automation_id, params, rerun_of), False
            return job, True
        except IntegrityError as exc:
            if not _terms_changed(exc):
                raise
        logger.info("automation %s changed since its terms were read: checked again", automation_id)
        terms = _terms_accepting(automation_id, params, read=True)
    raise Conflict("The automation changed while this request ran.", code="concurrent_change")


# Writes of one job tried on terms read for it, each time the automation changed between
# the read and the write: more than once is already a race with its editors.
_WRITES_ON_CHANGED_TERMS = 3


def _terms_accepting(automation_id: int, params: Any, *, read: bool = False) -> JobTerms:
    """The automation's terms, when they accept a job with ``params`` (else the refusal):
    those this process keeps unless ``read``; a refusal is decided on terms read for it,
    so that none comes from terms that changed since."""
    terms = None if read else automation_terms.cached(automation_id)
    if terms is not None:
        try:
            _check_terms(terms, automation_id, params)
            return terms
        except DomainError:
            now = automation_terms.fresh(automation_id)
            if now == terms:
                raise
            terms = now
    else:
        terms = automation_terms.fresh(automation_id)
    _check_terms(terms, automation_id, params)
    return terms


def _check_terms(terms: JobTerms | None, automation_id: int, params: Any) -> None:
    if terms is None:
        raise _unknown_automation()
    if not terms.is_active:
        raise _automation_inactive()
    job_params_check(params, schema=terms.params_schema, automation_id=automation_id)


def _terms_changed(exc: IntegrityError) -> bool:
    """Whether the job's INSERT failed because its automation no longer has the terms the
    job was checked against (``automation_id_on_terms`` gave the column its NULL)."""
    return getattr(getattr(exc.__cause__, "diag", None), "column_name", None) == "automation_id"


def job_rerun(
    *, tenant: Any, job_id: int, requested_by: Any, idempotency_key: str | None = None
) -> tuple[Job, bool]:
    """Run one of the tenant's finished jobs again: a new job of its automation with its
    params, ``rerun_of`` naming it. Returns ``(job, created)``.

    The new job is created by ``job_create``, so it passes the checks any job passes
    against its automation as it is now (active, its parameter schema of today), records
    JobCreated the same way and honors the idempotency key the same way.

    No row lock: a finished job stays finished, and what is copied from it never changes.
    """
    original = job_get(tenant=tenant, job_id=job_id)
    if original is None:
        raise NotFound("There is no such job.", code="job_not_found")
    original.check_rerun()
    # The API's callers are people of an active tenant already; the admin's are not.
    if not tenant_is_active(original.tenant_id):
        raise Conflict("The job's tenant is inactive.", code="tenant_inactive")
    return job_create(
        tenant=tenant,
        automation_id=original.automation_id,
        params=original.params,
        requested_by=requested_by,
        idempotency_key=idempotency_key,
        rerun_of=original,
    )


def _write_created(job: Job, terms: JobTerms, *, actor: Any) -> None:
    """Write the new ``job`` and record its JobCreated, in one statement: the event's
    payload, its runs' envelopes and its aggregate id take the job's id from its INSERT,
    and the job its automation only while it has ``terms`` (an IntegrityError otherwise)."""
    event = job.created_event()
    job.automation_id = automation_id_on_terms(terms)
    try:
        publish_new(
            event.name, event.payload, row=job, id_key="job_id", tenant=job.tenant_id, actor=actor
        )
    finally:
        job.automation_id = terms.automation_id
    count_transition(job)


def _write_unless_key_taken(job: Job, terms: JobTerms, *, actor: Any) -> Job | None:
    """Write ``job`` with its JobCreated; or, when a concurrent request with the same
    idempotency key got there first, return that request's job instead (nothing written).

    A savepoint, needed only with a key: the insert that collides with the other
    request's waits for it to commit, fails, and the rest of the transaction carries on.
    """
    try:
        with transaction.atomic():
            _write_created(job, terms, actor=actor)
    except IntegrityError:
        existing = Job.objects.filter(
            tenant=job.tenant_id, idempotency_key=job.idempotency_key
        ).first()
        if existing is None:
            raise
        return existing
    return None


def _replayed(job: Job, automation_id: int, params: dict[str, Any], rerun_of: Job | None) -> Job:
    # A re-run and a new request for the same automation and params are two requests.
    if (
        job.automation_id != automation_id
        or job.params != params
        or job.rerun_of_id != (rerun_of.pk if rerun_of is not None else None)
    ):
        raise Conflict(
            "This idempotency key was used for another request.",
            code="idempotency_key_reused",
            details={"job": job.pk},
        )
    return job


def job_automation_check(*, automation_id: int, params: Any) -> Any:
    """The automation jobs with these ``params`` would run, refused unless they can: it
    exists (400), is active (409) and its parameter schema accepts them (400). Whoever
    starts jobs checks here: a request now, a schedule when it is created or resumed."""
    automation = automation_get(automation_id)
    if automation is None:
        raise _unknown_automation()
    if not automation.is_active:
        raise _automation_inactive()
    job_params_check(params, schema=automation.params_schema, automation_id=automation.id)
    return automation


def _unknown_automation() -> InvalidInput:
    return InvalidInput(
        "There is no such automation.",
        code="unknown_automation",
        details={"automation": ["There is no such automation."]},
    )


def _automation_inactive() -> Conflict:
    return Conflict("The automation is inactive.", code="automation_inactive")


_SCHEMA_BROKEN = (
    "The automation's parameter schema is broken; nothing can be started or scheduled until "
    "it is fixed."
)
_SCHEMA_TOO_COSTLY = (
    "The automation's parameter schema takes too long to check these parameters (a pattern "
    "of it backtracks on them); the schema needs fixing."
)


def job_params_check(params: Any, *, schema: dict[str, Any] | None, automation_id: int) -> None:
    """The checks a job's parameters pass before it is created (also made by callers that
    keep parameters for later jobs, such as a schedule, when they are saved)."""
    if not isinstance(params, dict):
        raise InvalidInput(
            "The parameters must be a JSON object.",
            code="invalid_params",
            details={"params": ["Must be a JSON object."]},
        )
    size = json_size(params)
    if size > settings.JOB_PARAMS_MAX_BYTES:
        raise InvalidInput(
            f"The parameters take {size} bytes; the limit is {settings.JOB_PARAMS_MAX_BYTES}.",
            code="params_too_large",
            details={"params": [f"At most {settings.JOB_PARAMS_MAX_BYTES} bytes of JSON."]},
        )
    try:
        # The same validator that accepted the schema when the automation was saved.
        errors = params_errors(params, schema)
    except UnusableSchema as exc:
        # Too costly on these parameters, the schema is still the thing to fix, but only
        # they meet it: a warning, not an error any member could raise at will in the
        # operators' alerts.
        costly = isinstance(exc, TooCostly)
        logger.log(
            logging.WARNING if costly else logging.ERROR,
            "automation %s: its parameter schema is %s: %s",
            automation_id,
            "too costly" if costly else "unusable",
            exc,
        )
        raise Conflict(
            _SCHEMA_TOO_COSTLY if costly else _SCHEMA_BROKEN,
            code="automation_misconfigured",
            details={"params_schema": [str(exc)]},
        ) from None
    if errors:
        raise InvalidInput(
            "The parameters do not match the automation's schema.",
            code="invalid_params",
            details={"params": errors},
        )


def json_size(value: Any) -> int:
    """Bytes of ``value`` as compact JSON: what the limits count."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


@transaction.atomic
def job_cancel(*, tenant: Any, job_id: int, actor: Any) -> Job:
    """Cancel a pending job at once, or ask the worker of a running one to stop."""
    job = _locked(Job.objects.filter(tenant=tenant), job_id)
    was = job.status
    event = job.request_cancel(now=timezone.now())
    save_transition(job, was=was)
    if event is not None:
        record_transition(job, event, actor=actor)
    return job


# --- workers ----------------------------------------------------------------------------


def job_claim(
    *,
    worker: Any,
    job_id: int,
    lease: timedelta | None = None,
    claim_token: uuid.UUID | None = None,
) -> Job:
    """The worker claims a pending job of its automation; refusals are expected (409).

    A worker may name its claim (``claim_token``): the same claim sent again, its answer
    lost on the way back, is answered with the job as that claim left it, its lease
    renewed, instead of ``already_claimed`` for a job nobody would then run.

    A pending job whose tenant was deactivated is not started: it is canceled as
    ``job.cancel_deactivated`` would cancel it, and the claim refused ``not_pending``."""
    try:
        try:
            job = _claim(
                worker=worker, job_id=job_id, lease=lease or lease_length(), claim_token=claim_token
            )
        except _TenantInactive:
            # Its tenant was deactivated, and the task that cancels its pending jobs has not
            # come to it yet (or it came after the task looked): canceled here, as the task
            # would, so that the poll stops offering it.
            canceled = job_cancel_deactivated(job_id=job_id, pending_only=True)
            status = canceled.status if canceled is not None else Job.objects.get(pk=job_id).status
            raise Conflict(
                "The job is not pending.", code="not_pending", details={"status": status}
            ) from None
    except Conflict as refusal:
        # A refused claim is the protocol working, not a failure.
        count_claim_refusal(refusal.code)
        logger.info("claim of job %s by worker %s refused: %s", job_id, worker.pk, refusal.code)
        raise
    worker_seen(worker_id=worker.pk)
    return job


@transaction.atomic
def _claim(*, worker: Any, job_id: int, lease: timedelta, claim_token: uuid.UUID | None) -> Job:
    automation_id = worker.automation_id
    lock_claims_of(automation_id)
    job = _locked(Job.objects.filter(automation_id=automation_id), job_id)
    if claim_token is not None and job.claim_token == claim_token:
        # This very claim, sent again: the first one's answer never reached the worker.
        job.heartbeat(
            claim_token=claim_token,
            lease=lease,
            now=timezone.now(),
            time_limit=automation_time_limit(automation_id),
        )
        save_transition(job, was=JobStatus.RUNNING)
        return job
    if job.status == JobStatus.PENDING and not tenant_is_active(job.tenant_id):
        raise _TenantInactive
    automation = automation_get(automation_id)
    running = running_count(automation_id=automation_id)
    event = job.start(
        worker=worker,
        lease=lease,
        now=timezone.now(),
        running=running,
        max_concurrency=automation.max_concurrency,
        claim_token=claim_token,
    )
    save_transition(job, was=JobStatus.PENDING)
    record_transition(job, event, actor=worker)
    return job


class _TenantInactive(Exception):
    """The claimed job is its deactivated tenant's: it is canceled instead."""


def lock_claims_of(automation_id: int) -> None:
    """Serialize the claims of one automation until the transaction ends.

    An advisory lock rather than a row lock on ``automations``: it keeps the claim out
    of the catalog's table (whose row locks the catalog's own writes take) and never
    blocks the inserts of new jobs, whose foreign-key checks share-lock that row. Two
    automations whose ids collide in the 31-bit key only share a lock: slower, never
    wrong.
    """
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)",
            [CLAIM_LOCK_NAMESPACE, automation_id % 2**31],
        )


@transaction.atomic
def job_heartbeat(*, worker: Any, job_id: int, claim_token: uuid.UUID, progress: Any = None) -> Job:
    """Extend the claim's lease; the answer tells the worker whether to stop."""
    if progress is not None:
        # Shown to people and rewritten at every beat: bounded like the result.
        _require_size("progress", progress, settings.JOB_RESULT_MAX_BYTES)
    job = _locked(Job.objects.filter(automation_id=worker.automation_id), job_id)
    job.heartbeat(
        claim_token=claim_token,
        lease=lease_length(),
        now=timezone.now(),
        progress=progress,
        time_limit=automation_time_limit(worker.automation_id),
    )
    save_transition(job, was=JobStatus.RUNNING)
    # After the commit: the worker's row is not part of the job's transaction.
    transaction.on_commit(lambda: worker_seen(worker_id=worker.pk))
    return job


@dataclass(frozen=True)
class OutputAppended:
    chunk: JobOutputChunk
    # False for a chunk stored before (a retried request): nothing was stored again.
    stored: bool


@transaction.atomic
def job_output_append(
    *, worker: Any, job_id: int, claim_token: uuid.UUID, seq: int, text: str
) -> OutputAppended:
    """Store a chunk of the running job's output, once per (job, attempt, seq).

    The job's row lock orders the chunks: each starts where the newest ends. Chunks of an
    attempt come in order (``seq`` one past the newest); a repeat of an earlier one (the
    same text) stores nothing, and other text under a stored ``seq`` is refused. Past
    JOB_OUTPUT_MAX_CHARS, the oldest chunks are deleted (never the new one). No event:
    output is no transition, and the outbox would carry every line of it.
    """
    job = _locked(Job.objects.filter(automation_id=worker.automation_id), job_id)
    job.check_output(claim_token)
    chunks = JobOutputChunk.objects.filter(job=job)
    newest_of_attempt = chunks.filter(attempt=job.attempt).order_by("-seq").first()
    expected = 0 if newest_of_attempt is None else newest_of_attempt.seq + 1
    same = chunks.filter(attempt=job.attempt, seq=seq).first()
    if same is not None:
        if same.text != text:
            # Not a retry (a retry sends the same text): storing nothing and answering
            # "stored before" would drop this text without a word.
            raise Conflict(
                f"Chunk {seq} was stored with other text; the next one is {expected}.",
                code="output_seq_taken",
                details={"seq": seq, "expected_seq": expected},
            )
        return OutputAppended(same, stored=False)
    if seq != expected:
        raise Conflict(
            f"Chunk {seq} comes out of order; the next one is {expected}.",
            code="output_out_of_order",
            details={"expected_seq": expected},
        )
    newest = chunks.order_by("-offset").first()
    chunk = JobOutputChunk.objects.create(
        job=job,
        attempt=job.attempt,
        seq=seq,
        offset=0 if newest is None else newest.end,
        text=text,
    )
    # Whatever starts before the window of the last JOB_OUTPUT_MAX_CHARS goes: the
    # reader learns of it from the log's first offset (dropped_before).
    chunks.filter(offset__lt=chunk.end - settings.JOB_OUTPUT_MAX_CHARS).exclude(
        pk=chunk.pk
    ).delete()
    live.announce_output(job.pk)
    return OutputAppended(chunk, stored=True)


@transaction.atomic
def job_complete(
    *,
    worker: Any,
    job_id: int,
    claim_token: uuid.UUID,
    result: Any,
    output_tail: str = "",
    exit_code: int | None = None,
) -> Job:
    """The worker's success report: the result, and the command's exit code and output."""
    _require_size("result", result, settings.JOB_RESULT_MAX_BYTES)
    return _end_reported(
        worker,
        job_id,
        lambda job: job.complete(
            claim_token=claim_token,
            result=result,
            now=timezone.now(),
            output_tail=_tail(output_tail),
            exit_code=exit_code,
        ),
    )


@transaction.atomic
def job_fail(
    *,
    worker: Any,
    job_id: int,
    claim_token: uuid.UUID,
    error: str,
    output_tail: str = "",
    exit_code: int | None = None,
    reason: str | None = None,
) -> Job:
    """The worker's failure report. ``reason`` defaults to ``exit_code`` when the command
    ended with a non-zero code, else ``error``; a worker may say ``timeout``."""
    if reason is None:
        reason = Job.FailureReason.EXIT_CODE if exit_code else Job.FailureReason.ERROR
    return _end_reported(
        worker,
        job_id,
        lambda job: job.fail(
            reason=reason,
            now=timezone.now(),
            error=error,
            output_tail=_tail(output_tail),
            exit_code=exit_code,
            claim_token=claim_token,
        ),
    )


def _end_reported(worker: Any, job_id: int, end: Callable[[Job], JobEvent | None]) -> Job:
    """The worker's job of ``job_id``, locked, ended by ``end`` as the worker reported; a
    repeated report changes nothing (``end`` returns no event) and is not written again."""
    job = _locked(Job.objects.filter(automation_id=worker.automation_id), job_id)
    was = job.status
    event = end(job)
    if event is not None:
        save_transition(job, was=was)
        record_transition(job, event, actor=worker)
    return job


# --- deactivations ------------------------------------------------------------------------

# Why the hub canceled a job (kept in its ``error``, and in its JobCanceled event).
DEACTIVATED_AUTOMATION = "Its automation was deactivated."
DEACTIVATED_TENANT = "Its tenant was deactivated."
# Jobs listed at a time by jobs_cancel_deactivated (each is then its own transaction).
DEACTIVATION_PAGE = 200


def jobs_cancel_deactivated(
    *, automation_id: int | None = None, tenant_id: int | None = None
) -> int:
    """End what is left of the jobs of a deactivated automation or tenant (the
    ``job.cancel_deactivated`` task, subscribed to AutomationDeactivated and
    TenantDeactivated). Returns how many jobs it changed.

    Nothing would ever end them otherwise: a deactivated automation's worker is refused,
    and the monitor powers on no inactive automation's machine. Each job is its own short
    transaction, the jobs walked once in id order; one created meanwhile (its insert raced
    with the deactivation) is left to the monitor's check of stranded jobs
    (``job.stranded``).
    """
    if (automation_id is None) == (tenant_id is None):
        raise ValueError("give an automation_id or a tenant_id")
    changed, after = 0, 0
    while True:
        page = job_ids_unfinished_of(
            automation_id=automation_id, tenant_id=tenant_id, after=after, limit=DEACTIVATION_PAGE
        )
        for job_id in page:
            changed += job_cancel_deactivated(job_id=job_id) is not None
        if len(page) < DEACTIVATION_PAGE:
            return changed
        after = page[-1]


def job_cancel_deactivated(
    *, job_id: int, skip_locked: bool = False, pending_only: bool = False
) -> Job | None:
    """Cancel one job whose automation or tenant was deactivated, as a person's cancel
    would: a pending job at once (``error`` says why; JobCanceled recorded by the system),
    a running one (unless ``pending_only``) asked to stop (its worker learns it at its next
    heartbeat; one that can no longer report is ended canceled by its lease). Returns the
    job, or None when there was nothing to do (finished, asked already, still active; or,
    with ``skip_locked``, held by someone else right now)."""
    statuses = (JobStatus.PENDING,) if pending_only else (JobStatus.PENDING, JobStatus.RUNNING)
    with transaction.atomic():
        job = (
            Job.objects.select_for_update(of=("self",), skip_locked=skip_locked)
            .filter(pk=job_id, status__in=statuses)
            .first()
        )
        if job is None or (job.status == JobStatus.RUNNING and job.cancel_requested):
            return None
        reason = _deactivation_reason(job)
        if reason is None:
            return None
        was = job.status
        event = job.request_cancel(now=timezone.now(), reason=reason)
        save_transition(job, was=was)
        if event is not None:
            record_transition(job, event, actor="system")
    logger.info("job %s (%s): cancel for deactivation: %s", job_id, was, reason)
    return job


def _deactivation_reason(job: Job) -> str | None:
    automation = automation_get(job.automation_id)
    if automation is None or not automation.is_active:
        return DEACTIVATED_AUTOMATION
    if not tenant_is_active(job.tenant_id):
        return DEACTIVATED_TENANT
    return None


# --- plumbing -----------------------------------------------------------------------------


def _tail(output: str) -> str:
    """The end of the command's output, as much as is kept."""
    return output[-settings.JOB_OUTPUT_TAIL_MAX_CHARS :]


def _locked(queryset, job_id: int) -> Job:
    """The job, its row locked until the transaction ends; 404 outside the queryset's scope."""
    job = queryset.select_for_update(of=("self",)).filter(pk=job_id).first()
    if job is None:
        raise NotFound("There is no such job.", code="job_not_found")
    return job


def save_transition(job: Job, *, was: str) -> None:
    """Write the transition, on the condition that the status is still the one it left.

    The row is locked, so the condition always holds; it is the guard that would turn a
    future path that forgot the lock into a refusal instead of a lost update.
    """
    job.updated_at = timezone.now()
    values = {name: getattr(job, name) for name in (*_STATE_FIELDS, "updated_at")}
    changed = Job.objects.filter(pk=job.pk, status=was).update(**values)
    if changed != 1:
        raise Conflict("The job changed while this request ran.", code="concurrent_change")
    if job.is_finished:
        # Its followers end their streams now rather than at their next read.
        live.announce_output(job.pk)


def record_transition(job: Job, event: JobEvent, *, actor: Any) -> None:
    """Record the event of the transition the job just made (and count it, once committed)."""
    publish(event.name, event.payload, tenant=job.tenant_id, aggregate=job, actor=actor)
    count_transition(job)


def count_transition(job: Job, *, to: str | None = None) -> None:
    count_transition_on_commit(
        to or job.status,
        created_at=job.created_at,
        started_at=job.started_at if job.status == JobStatus.RUNNING else None,
        finished_at=job.finished_at if job.is_finished else None,
    )


def _require_size(name: str, value: Any, limit: int) -> None:
    size = json_size(value)
    if size > limit:
        raise InvalidInput(
            f"The {name} takes {size} bytes; the limit is {limit}.",
            code=f"{name}_too_large",
            details={name: [f"At most {limit} bytes of JSON."]},
        )
