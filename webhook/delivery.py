"""The delivery engine: a tenant's events delivered to its webhook endpoints.

Deliveries are born in ``webhook.recording`` (the outbox's event listener), inside the
transaction that records the event, each joining its endpoint's run of ``webhook.deliver``
that is due and not at work yet (up to ``DELIVERIES_PER_RUN``) or taking a new one
(``schedule_delivery``, which retries and hand-overs use too). A run
(``deliveries_run``) attempts its deliveries one after another, a fast receiver's in
batches begun and recorded together, and hands on what it did not take when it stops
short (``_hand_on``); each retry is a new run, due after the next delay of
``WEBHOOK_RETRY_DELAYS``. The HTTP requests happen outside any transaction.

While an endpoint fails, one delivery probes it (the one scheduled) and the others are
parked. The probe comes back after at most ``probe_interval`` however far its own schedule
has gone, so a receiver that answers again is found within seconds of a short outage;
its success takes the parked ones up at once, at the pace the receiver answers (the
slow-receiver guard). A probe that ends (delivered, failed for good) never leaves parked
deliveries without one: a failure hands the probe on to the oldest parked delivery. Every
decision about parking is taken under the endpoint's row lock (``FOR SHARE`` in the event's
transaction, ``FOR NO KEY UPDATE`` in an attempt's), so a delivery parked by an event and
the success that un-parks cannot miss each other. A disabled endpoint's deliveries are held
(parked) for its enable, ``WEBHOOK_HELD_MAX_AGE_SECONDS`` at most.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import uuid
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from time import monotonic
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import BooleanField
from django.db.models.expressions import RawSQL
from django.utils import timezone

from common import tracing
from common.context import log_context
from common.errors import Conflict, NotFound
from job.selectors import job_traceparent
from outbox.catalog import get_catalog
from outbox.services import actor_label, dispatch
from webhook import transport
from webhook.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhook.secret_box import unseal
from webhook.signing import signed_headers

logger = logging.getLogger("hubdommed.webhook")

DELIVER_TASK = "webhook.deliver"
# Characters of a receiver's answer kept with the attempt.
EXCERPT_CHARS = 1024
# Parked deliveries taken up per success of their endpoint (each success takes the next).
UNPARK_BATCH = 100
# Deliveries one run of webhook.deliver takes at most, one after another: a new delivery
# joins its endpoint's run due now while it has fewer. More runs of a fast receiver go on
# at once, one per worker slot.
DELIVERIES_PER_RUN = 100
# Deliveries of a run to a fast receiver begun together, and their successes recorded
# together: two statements for a batch. Each counts as in flight until recorded, so a
# batch sends for half of WEBHOOK_SLOW_SECONDS at most (``_batch``).
BATCH = 25
# A failing endpoint's probe comes back after this share of how long it has been failing.
PROBE_SHARE = 0.05
# The advisory lock's first key: an attempt in flight holds (ATTEMPT_LOCK_NAMESPACE,
# delivery id mod 2**31) on its worker's database session from its start to its record.
# A worker that dies loses its session, and the lock with it, at once: its attempt no
# longer counts as in flight, and its endpoint takes the next one within a second, not
# after the attempt's whole budget.
#
# The lock is only ever tried, never waited for, and only by a session that holds the
# delivery's row: one that finds it taken leaves the delivery to the attempt in flight
# (``Outcome.STALE``). Waiting for it under the row would deadlock with that attempt's
# record, which takes the row while the lock is held. (The fast way's statements try it
# after their update: one that finds it taken has also moved the attempt's start to its
# own, which only makes that attempt look younger to the slow-receiver guard until its
# record. Only a run with two holders at once gets there.)
ATTEMPT_LOCK_NAMESPACE = 0x776861  # "wha"
_LOCK_KEY = "(({id}) %% 2147483648)::int4"
# An attempt's lock, held by a session of this database (advisory locks are the
# database's own: another database on the same server may hold the same keys).
_HELD = (
    "locktype = 'advisory' AND classid = {ns} AND objsubid = 2 AND granted "
    "AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
# Whether the attempt of the delivery row ``{table}`` is still held by a live session.
_ALIVE = (
    "EXISTS (SELECT 1 FROM pg_locks WHERE "  # noqa: S608 (the module's own constants)
    + _HELD
    + " AND objid = ({table}.id %% 2147483648)::int4::oid)"
)
# Which of the deliveries given another session attempts now.
_HELD_ELSEWHERE = f"""
    SELECT EXISTS (SELECT 1 FROM pg_locks WHERE {_HELD.format(ns=ATTEMPT_LOCK_NAMESPACE)}
                      AND objid = (%s %% 2147483648)::int4::oid AND pid <> pg_backend_pid())
"""  # noqa: S608 (only the module's own constants are formatted in)
_HELD_ELSEWHERE = f"""
    SELECT d FROM unnest(%s::bigint[]) AS d
     WHERE EXISTS (SELECT 1 FROM pg_locks WHERE {_HELD.format(ns=ATTEMPT_LOCK_NAMESPACE)}
                      AND objid = (d %% 2147483648)::int4::oid AND pid <> pg_backend_pid())
"""  # noqa: S608 (only the module's own constants are formatted in)


# --- a delivery's run ---------------------------------------------------------------------


def schedule_delivery(delivery: WebhookDelivery, *, delay: float | None) -> uuid.UUID:
    """A new run for the delivery, due after ``delay`` (the caller saves the delivery)."""
    return schedule_deliveries([delivery], delay=delay)


def schedule_deliveries(deliveries: list[WebhookDelivery], *, delay: float | None) -> uuid.UUID:
    """One new run for these deliveries of one endpoint, due after ``delay``: it begins with
    the first (its payload's), then takes the others (the caller saves them)."""
    first = deliveries[0]
    # The run is in the trace of the job it begins with, whichever run or request asks
    # for it (a probe's run taking up the parked deliveries of other jobs).
    traceparent = _trace_of(first.body)
    with (
        tracing.span("webhook.schedule", traceparent=traceparent) if traceparent else nullcontext()
    ):
        run_id = dispatch(
            DELIVER_TASK, {"delivery_id": first.pk}, tenant=first.tenant_id, delay=delay
        )
    due_at = timezone.now() + timedelta(seconds=delay or 0)
    for delivery in deliveries:
        delivery.schedule(run_id=run_id, due_at=due_at)
    return run_id


# --- one attempt --------------------------------------------------------------------------


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRYING = "retrying"
    FAILED = "failed"
    # Not attempted: another run's business, the endpoint disabled, or a slow receiver's turn
    # (parked behind its live attempt, or, when the token was busy, a new run due later).
    STALE = "stale"
    HELD = "held"
    DEFERRED = "deferred"
    # Attempted and failed, and parked behind its endpoint's probe.
    PARKED = "parked"


@dataclass(frozen=True)
class _Request:
    delivery_id: int
    endpoint_id: int
    url: str
    body: str
    message_id: str
    secrets: list[str]
    number: int


def delivery_attempt(*, delivery_id: int, run_id: uuid.UUID) -> Outcome:
    """Make the attempt of one delivery that run ``run_id`` was scheduled for, and record
    what came of it (durably): a run's step, alone."""
    (outcome,) = _step(delivery_id, run_id, tried=[delivery_id], durable=True).outcomes
    return outcome


@dataclass(frozen=True)
class _Done:
    """What one step of a run came to: one delivery's attempt, or a batch's."""

    outcomes: list[Outcome]
    # Whether the run takes its next deliveries: these were delivered fast (or were not the
    # run's business), so the receiver takes the next at once.
    goes_on: bool = False
    # The run's next delivery, when the step's own statement looked it up.
    next_id: int | None = None
    next_known: bool = False
    # The last delivery whose outcome was committed without waiting for the disk (and no
    # durable commit after it): the run makes it durable before it returns.
    unflushed: int | None = None


def deliveries_run(
    *,
    delivery_id: int,
    run_id: uuid.UUID,
    deadline: float | None = None,
    most: int = DELIVERIES_PER_RUN,
) -> list[Outcome]:
    """The attempts run ``run_id`` was scheduled for: ``delivery_id`` first, then the other
    deliveries scheduled on the run, oldest first, one after another on the receiver's kept
    connection (begun and recorded ``BATCH`` at a time while the receiver answers fast).
    It goes on while they are delivered fast, ``most`` at most, and begins none once
    ``deadline`` (``time.monotonic()``) has passed. What it did not take when it stops is
    handed on (``_hand_on``), and every outcome is durable, before it returns: the worker
    marks the run done only after."""
    outcomes: list[Outcome] = []
    tried = [delivery_id]
    done = _step(delivery_id, run_id, tried=tried)
    unflushed = None
    while True:
        outcomes.extend(done.outcomes)
        if done.unflushed is not None:
            unflushed = done.unflushed
        elif any(outcome is not Outcome.STALE for outcome in done.outcomes):
            unflushed = None  # committed durably, and every earlier commit with it
        if done.goes_on:
            next_id = done.next_id if done.next_known else _next_of_run(run_id, tried)
            if next_id is None:
                break  # every delivery of the run taken
            room = most - len(tried)
            if room > 0 and (deadline is None or monotonic() < deadline):
                done = _batch(run_id, tried, size=min(BATCH, room), deadline=deadline)
                if done is None:
                    # Not begun as a batch (the receiver no longer counts as fast, or one
                    # of its attempts runs long): the whole way, one delivery.
                    tried.append(next_id)
                    done = _step(next_id, run_id, tried=tried)
                continue
        # Stopped short: a slow or failing receiver, its endpoint disabled or busy, the
        # run's share or time spent.
        if _hand_on(run_id):
            unflushed = None
        break
    if unflushed is not None:
        _flush(unflushed)
    return outcomes


def run_deadline(started: float) -> float:
    """The ``time.monotonic()`` past which a run of webhook.deliver that began at
    ``started`` begins no more attempts: its task's time limit, less an attempt's whole
    budget and a margin, so that the last attempt and the run's hand-on end before the
    worker gives up on it. A run always makes its first attempt."""
    limit = get_catalog().task(DELIVER_TASK).time_limit_seconds
    return started + limit - _attempt_budget().total_seconds() - RUN_MARGIN_SECONDS


def _step(delivery_id: int, run_id: uuid.UUID, *, tried: list[int], durable: bool = False) -> _Done:
    """One delivery's attempt, begun and recorded on its own: the run's first, and any
    its receiver does not take as fast."""
    request = _begin_fast(delivery_id, run_id) or _begin(delivery_id, run_id)
    if isinstance(request, Outcome):
        # Not attempted. A delivery that is not the run's any more (another run's, parked,
        # finished) leaves the run's others to it; any other (disabled, deferred) stops it.
        return _Done([request], goes_on=request is Outcome.STALE)
    # The attempt's log lines name the job the event is about (the task's run binds the rest).
    with log_context(job_id=_job_id_of(request.body)):
        started_at, answer = _send(request)
        if _delivered_fast(answer):
            recorded = _record_fast(
                request, run_id, started_at, answer, tried=tried, durable=durable
            )
            if recorded is not None:
                _log_outcome(request, Outcome.DELIVERED, answer)
                next_id, waited = recorded
                return _Done(
                    [Outcome.DELIVERED],
                    goes_on=True,
                    next_id=next_id,
                    next_known=True,
                    unflushed=None if waited else request.delivery_id,
                )
        try:
            outcome = _record(request, run_id, started_at, answer)
        finally:
            _let_go_attempt(request.delivery_id)
    return _Done([outcome], goes_on=outcome is Outcome.DELIVERED and _fast(answer))


def _batch(
    run_id: uuid.UUID, tried: list[int], *, size: int, deadline: float | None
) -> _Done | None:
    """The run's next ``size`` deliveries (not in ``tried``), begun in one statement, sent
    one after another, and their fast successes recorded in one: while the receiver answers
    fast, two statements a batch. The first answer that is not a fast success is recorded
    on its own, the whole way, and stops the batch and the run: the ones not sent are let
    go (no longer in flight) for the run's hand-on, as when the run's deadline comes.

    Each delivery of a batch counts as in flight from the batch's beginning, so the batch
    sends no more once half of WEBHOOK_SLOW_SECONDS has gone by: the rest are let go, and
    the run goes on with a batch begun afresh (a batch of a receiver that answers in
    0.1 s is five deliveries, not looking slow to the guard of the endpoint's other
    runs). None: no batch begun (the endpoint does not count as fast, or an attempt of
    it runs past WEBHOOK_SLOW_SECONDS)."""
    requests = _begin_batch(run_id, tried, size)
    if not requests:
        return None
    began = monotonic()
    sent: list[tuple[_Request, datetime, transport.Answer]] = []
    stop: tuple[_Request, datetime, transport.Answer] | None = None
    unsent: list[_Request] = []
    cut = False  # the batch's time spent: the run goes on
    for position, request in enumerate(requests):
        if position:
            now = monotonic()
            cut = now - began >= settings.WEBHOOK_SLOW_SECONDS / 2
            if cut or (deadline is not None and now >= deadline):
                unsent = requests[position:]
                break
        with log_context(job_id=_job_id_of(request.body)):
            started_at, answer = _send(request)
        if not _delivered_fast(answer):
            stop = (request, started_at, answer)
            unsent = requests[position + 1 :]
            break
        sent.append((request, started_at, answer))
    # What the run took: the ones let go for the batch's time are taken again next.
    tried.extend(request.delivery_id for request in requests if not cut or request not in unsent)
    recorded, next_id, waited = _record_batch(run_id, requests[0].endpoint_id, sent, unsent, tried)
    outcomes = []
    whole_way = False
    for request, started_at, answer in sent:
        with log_context(job_id=_job_id_of(request.body)):
            if request.delivery_id in recorded:
                _log_outcome(request, Outcome.DELIVERED, answer)
                outcomes.append(Outcome.DELIVERED)
            else:
                # Not recorded with the others (parked deliveries to take up, a failure
                # recorded meanwhile): the whole way decides, its attempt held until then.
                whole_way = True
                try:
                    outcomes.append(_record(request, run_id, started_at, answer))
                finally:
                    _let_go_attempt(request.delivery_id)
    if stop is not None:
        request, started_at, answer = stop
        with log_context(job_id=_job_id_of(request.body)):
            try:
                outcomes.append(_record(request, run_id, started_at, answer))
            finally:
                _let_go_attempt(request.delivery_id)
    goes_on = (
        stop is None
        and (cut or not unsent)
        and all(outcome is Outcome.DELIVERED for outcome in outcomes)
    )
    last_sent = sent[-1][0].delivery_id if sent else None
    return _Done(
        outcomes,
        goes_on=goes_on,
        next_id=next_id,
        next_known=not whole_way,
        unflushed=None if waited or whole_way or stop is not None else last_sent,
    )


def _send(request: _Request) -> tuple[datetime, transport.Answer]:
    started_at = timezone.now()
    with tracing.maybe_span(
        "webhook.deliver POST",
        traceparent=_trace_of(request.body),
        kind=tracing.SpanKind.CLIENT,
        attributes={
            "http.request.method": "POST",
            "hubdommed.delivery_id": request.delivery_id,
            "hubdommed.endpoint_id": request.endpoint_id,
            "hubdommed.attempt": request.number,
        },
    ) as span:
        answer = _post(request, started_at)
        if span is not None:
            if answer.status_code is not None:
                span.set_attribute("http.response.status_code", answer.status_code)
            if answer.error or (answer.status_code or 0) >= 400:
                span.set_status(tracing.StatusCode.ERROR, answer.error[:200] or None)
    return started_at, answer


def _trace_of(body: str) -> str | None:
    """The trace of the job a delivery's ``body`` is about, when it is not the current
    one: a run takes the deliveries of many jobs (a failing endpoint's parked ones, taken
    up together by its probe's run), and each attempt, what its receiver is told and the
    runs it asks for stay in their own job's trace. None: the current span will do."""
    if not tracing.active():
        return None
    job_id = _job_id_of(body)
    if job_id is None:
        return None
    traceparent = job_traceparent(job_id)
    current = tracing.current_ids()
    if not traceparent or (current and tracing.trace_id_of(traceparent) == current[0]):
        return None
    return traceparent


def _fast(answer: transport.Answer) -> bool:
    return answer.latency_ms < settings.WEBHOOK_SLOW_SECONDS * 1000


def _delivered_fast(answer: transport.Answer) -> bool:
    return (
        not answer.error
        and answer.status_code is not None
        and 200 <= answer.status_code < 300
        and _fast(answer)
    )


def _post(request: _Request, started_at: datetime) -> transport.Answer:
    try:
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "HubDomMed-Webhooks/1",
            **signed_headers(
                message_id=request.message_id,
                body=request.body,
                secrets_in_use=request.secrets,
                at=started_at,
            ),
        }
        # The receiver may join the trace of the change it is told of (W3C Trace Context).
        tracing.inject(headers)
        return transport.post(request.url, request.body.encode(), headers)
    except Exception as exc:
        # Building or sending the request failed in a way the transport does not name (a
        # secret that cannot sign, a header that cannot be encoded): the delivery's failure,
        # recorded and retried like a receiver's, never the task's (whose retries would end
        # in the dead-letter queue with the delivery left pending).
        logger.exception("webhook %s attempt %d raised", request.message_id, request.number)
        return transport.Answer(
            None,
            int((timezone.now() - started_at).total_seconds() * 1000),
            f"{type(exc).__name__}: {exc}",
        )


def _job_id_of(body: str) -> int | None:
    """The job a delivery's body is about (its ``data.job_id``), if any."""
    try:
        job_id = json.loads(body).get("data", {}).get("job_id")
    except (ValueError, AttributeError):
        return None
    return job_id if isinstance(job_id, int) and not isinstance(job_id, bool) else None


@transaction.atomic
def _begin(delivery_id: int, run_id: uuid.UUID) -> _Request | Outcome:
    delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
    if (
        delivery is None
        or delivery.status != DeliveryStatus.PENDING
        or delivery.scheduled_run_id != run_id
    ):
        return Outcome.STALE
    if _attempt_held_elsewhere(delivery.pk):
        # Another holder of the run (a lease taken over from a worker that stalled) has this
        # delivery's attempt in flight: that attempt's record decides, and nothing here may
        # move the delivery meanwhile (parked or run again, its success would go unrecorded).
        return Outcome.STALE
    endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
    now = timezone.now()
    if not endpoint.is_active:
        # Held for the endpoint's enable (or its bound, WEBHOOK_HELD_MAX_AGE_SECONDS).
        delivery.park()
        delivery.save(update_fields=["scheduled_run_id", "next_attempt_at", "attempt_started_at"])
        return Outcome.HELD
    wait = _wait(endpoint, delivery, now)
    token = None
    if wait is not None or not endpoint.answers_fast:
        # One attempt at a time: the endpoint's row is the token. Another delivery holding it
        # is starting an attempt or recording an outcome right now, so this one waits,
        # without queueing on the lock (a dead receiver's backlog coming back at once would
        # hold every worker slot).
        token = (
            WebhookEndpoint.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(pk=endpoint.pk)
            .first()
        )
        if token is not None:
            wait = _wait(token, delivery, now)
        elif wait is None:
            wait = settings.WEBHOOK_DEFER_SECONDS
    if wait is not None:
        if token is not None:
            # Behind a live attempt of its endpoint, under the token: parked, no new run.
            # That attempt's outcome takes the endpoint's row after this commits, and takes
            # it up (a success: with the next batch; a failure: behind the probe, as every
            # parked delivery of a failing endpoint).
            delivery.park()
            delivery.save(
                update_fields=["scheduled_run_id", "next_attempt_at", "attempt_started_at"]
            )
            return Outcome.DEFERRED
        schedule_delivery(delivery, delay=wait)
        delivery.save(update_fields=["scheduled_run_id", "next_attempt_at"])
        return Outcome.DEFERRED
    if not _hold_attempt(delivery.pk):
        return Outcome.STALE  # taken since: every taker holds the row first, so never
    delivery.begin_attempt(now=now)
    delivery.save(update_fields=["attempt_started_at"])
    return _Request(
        delivery_id=delivery.pk,
        endpoint_id=endpoint.pk,
        url=endpoint.url,
        body=delivery.body,
        message_id=delivery.message_id,
        secrets=endpoint.signing_secrets(now),
        number=delivery.attempts + 1,
    )


# --- the common case, in one statement each ----------------------------------------------
# A delivery to a receiver that answers fast, with nothing of it in flight past
# WEBHOOK_SLOW_SECONDS: the attempt begins in one statement (the delivery's row lock, the
# guard's count and the liveness lock in one), and a fast success is recorded in one (the
# attempt, the delivery delivered). Anything else (a first attempt, a slow or failing
# receiver, parked deliveries to take up, a failure) goes the whole way, under the locks
# the decisions need.
# The beginning is committed without waiting for the disk (``synchronous_commit`` off for
# its own transaction, set by the statement itself): a beginning lost with the database
# only leaves its attempt uncounted by the slow-receiver guard (a receiver that answered
# fast may take one more at once), never an outcome unrecorded. The outcome waits for the
# disk, as it must: it is durable before the task's run is settled.

# The parts the statements of the fast way share.
# The endpoint still takes deliveries the fast way (FOR SHARE: see ``_RECORD_FAST``).
_ENDPOINT_STILL_FAST = """endpoint AS (
        SELECT id FROM webhook_endpoints
         WHERE id = %(endpoint_id)s AND status = 'active' AND answers_fast
           AND failing_since IS NULL
           AND NOT EXISTS (
               SELECT 1 FROM webhook_deliveries
                WHERE endpoint_id = %(endpoint_id)s AND status = 'pending'
                  AND scheduled_run_id IS NULL)
           FOR SHARE
    )"""
# The run's next delivery, after those it tried.
_NEXT_OF_RUN = """LATERAL (SELECT (SELECT id FROM webhook_deliveries
                             WHERE scheduled_run_id = %(run_id)s AND status = 'pending'
                               AND id <> ALL(%(tried)s)
                             ORDER BY id LIMIT 1) AS id) AS next"""
# An attempt of the endpoint begun lately by a live session, and not yet slow.
_LIVE_FAST_ATTEMPT = f"""
                  AND o.attempt_started_at > %(lost_before)s
                  AND o.attempt_started_at < %(slow_before)s
                  AND {_ALIVE.format(ns=ATTEMPT_LOCK_NAMESPACE, table="o")}"""


def _guard_times(now: datetime) -> dict[str, datetime]:
    """The bounds of ``_LIVE_FAST_ATTEMPT`` at ``now``."""
    return {
        "now": now,
        "lost_before": now - _attempt_budget(),
        "slow_before": now - timedelta(seconds=settings.WEBHOOK_SLOW_SECONDS),
    }


_BEGIN_FAST = f"""
    UPDATE webhook_deliveries AS d
       SET attempt_started_at = %(now)s
      FROM webhook_endpoints AS e
     WHERE d.id = %(delivery_id)s AND d.status = 'pending' AND d.scheduled_run_id = %(run_id)s
       AND e.id = d.endpoint_id AND e.status = 'active' AND e.answers_fast
       AND NOT EXISTS (
           SELECT 1 FROM webhook_deliveries AS o
            WHERE o.endpoint_id = d.endpoint_id AND o.id <> d.id{_LIVE_FAST_ATTEMPT})
 RETURNING d.body, d.message_id, d.attempts, d.endpoint_id, e.url, e.secret,
           e.previous_secret, e.previous_secret_expires_at,
           pg_try_advisory_lock({ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id="d.id")}),
           set_config('synchronous_commit', 'off', true)
"""  # noqa: S608 (only the module's own constants are formatted in)

# FOR SHARE on the endpoint: a failure's outcome (FOR NO KEY UPDATE) decides before or
# after this success, never beside it; an endpoint found failing, slow, disabled or with
# parked deliveries to take up is left to the whole way. The lock of the attempt is let go
# in the same statement once the success is recorded (else after the whole way's record:
# never while the delivery is pending), and the run's next delivery is looked up. A
# success that is not its run's last commits without waiting for the disk: the run's last
# outcome (or its hand-on, or ``_flush``) waits for it, and so makes every earlier one
# durable too (the log is written in order), before the run is marked done.
_RECORD_FAST = f"""
    WITH {_ENDPOINT_STILL_FAST}, delivered AS (
        UPDATE webhook_deliveries AS d
           SET status = 'delivered', attempts = %(number)s, attempt_started_at = NULL,
               last_status_code = %(status_code)s, last_latency_ms = %(latency_ms)s,
               last_error = '', finished_at = %(now)s, next_attempt_at = NULL,
               scheduled_run_id = NULL
          FROM endpoint
         WHERE d.id = %(delivery_id)s AND d.endpoint_id = endpoint.id
           AND d.status = 'pending' AND d.scheduled_run_id = %(run_id)s
     RETURNING d.id
    ), attempt AS (
        INSERT INTO webhook_attempts
               (delivery_id, number, started_at, status_code, latency_ms, error,
                response_excerpt)
        SELECT id, %(number)s, %(started_at)s, %(status_code)s, %(latency_ms)s, '', %(excerpt)s
          FROM delivered
     RETURNING delivery_id
    )
    SELECT recorded, next.id,
           CASE WHEN recorded > 0 THEN pg_advisory_unlock(
               {ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id="%(delivery_id)s")}) END,
           set_config('synchronous_commit',
                      CASE WHEN %(durable)s OR next.id IS NULL OR recorded = 0
                           THEN 'on' ELSE 'off' END, true)
      FROM (SELECT count(*) AS recorded FROM attempt) AS outcome,
           {_NEXT_OF_RUN}
"""  # noqa: S608 (only the module's own constants are formatted in)


def _begin_fast(delivery_id: int, run_id: uuid.UUID) -> _Request | Outcome | None:
    """The attempt begun the fast way; None: the whole way decides. Another holder of the
    run with the delivery's attempt in flight leaves it to that one (``Outcome.STALE``)."""
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            _BEGIN_FAST,
            {"delivery_id": delivery_id, "run_id": run_id, **_guard_times(now)},
        )
        row = cursor.fetchone()
    if row is None:
        return None
    body, message_id, attempts, endpoint_id, url, secret, previous, expires, held, _ = row
    if not held:
        return Outcome.STALE
    signer = WebhookEndpoint(
        secret=_unsealed(secret),
        previous_secret=_unsealed(previous),
        previous_secret_expires_at=expires,
    )
    return _Request(
        delivery_id=delivery_id,
        endpoint_id=endpoint_id,
        url=url,
        body=body,
        message_id=message_id,
        secrets=signer.signing_secrets(now),
        number=attempts + 1,
    )


# A worker process reads the same endpoints' secrets again and again: each sealed form
# (which changes with the secret, and with a re-encryption under a new key) is decrypted
# once. A process that signs with a secret holds it in memory anyway.
@functools.lru_cache(maxsize=1024)
def _unsealed(token: str) -> str:
    return unseal(token)


def _record_fast(
    request: _Request,
    run_id: uuid.UUID,
    started_at: datetime,
    answer: transport.Answer,
    *,
    tried: list[int],
    durable: bool,
) -> tuple[int | None, bool] | None:
    """Record a fast success in one statement (autocommit), with the run's next delivery
    (not in ``tried``): that next one's id, and whether the commit waited for the disk
    (``durable``, or the run's last). None: the whole way must decide (the attempt's lock
    still held: the caller lets it go after that record)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD_FAST,
            {
                "delivery_id": request.delivery_id,
                "endpoint_id": request.endpoint_id,
                "run_id": run_id,
                "number": request.number,
                "started_at": started_at,
                "status_code": answer.status_code,
                "latency_ms": answer.latency_ms,
                "excerpt": answer.excerpt[:EXCERPT_CHARS],
                "now": timezone.now(),
                "tried": tried,
                "durable": durable,
            },
        )
        recorded, next_id, _, commit = cursor.fetchone()
    if not recorded:
        return None
    return next_id, commit == "on"


# A batch of a run (its next deliveries, up to BATCH) to a receiver that answers fast,
# begun in one statement: each row as ``_BEGIN_FAST`` begins one (an attempt of another
# run in flight past WEBHOOK_SLOW_SECONDS begins none), the liveness lock taken for each.
# Their rows' locks wait for the events joining the run at them, as a single beginning
# does. Committed without waiting for the disk, as ``_BEGIN_FAST``.
_BEGIN_BATCH = f"""
    WITH chosen AS (
        SELECT id FROM webhook_deliveries
         WHERE scheduled_run_id = %(run_id)s AND status = 'pending' AND id <> ALL(%(tried)s)
         ORDER BY id
         LIMIT %(size)s
    ), begun AS (
        UPDATE webhook_deliveries AS d
           SET attempt_started_at = %(now)s
          FROM webhook_endpoints AS e
         WHERE d.id IN (SELECT id FROM chosen) AND d.status = 'pending'
           AND d.scheduled_run_id = %(run_id)s
           AND e.id = d.endpoint_id AND e.status = 'active' AND e.answers_fast
           AND NOT EXISTS (
               SELECT 1 FROM webhook_deliveries AS o
                WHERE o.endpoint_id = d.endpoint_id
                  AND o.scheduled_run_id IS DISTINCT FROM %(run_id)s{_LIVE_FAST_ATTEMPT})
     RETURNING d.id, d.body, d.message_id, d.attempts, d.endpoint_id, e.url, e.secret,
               e.previous_secret, e.previous_secret_expires_at
    )
    SELECT begun.*,
           pg_try_advisory_lock({ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id="begun.id")}),
           set_config('synchronous_commit', 'off', true)
      FROM begun
     ORDER BY begun.id
"""  # noqa: S608 (only the module's own constants are formatted in)

# The fast successes of a batch recorded in one statement, as ``_RECORD_FAST`` records one
# (none, if its endpoint is found failing, slow, disabled or with parked deliveries: each
# then goes the whole way); the batch's deliveries not sent are let go (no longer in
# flight), the liveness locks of the recorded and the unsent are let go (the others' after
# their record the whole way), and the run's next delivery is looked up. Durable only when
# the run has no next.
_RECORD_BATCH = f"""
    WITH {_ENDPOINT_STILL_FAST}, outcome AS (
        SELECT * FROM unnest(%(ids)s::bigint[], %(numbers)s::int[], %(started)s::timestamptz[],
                             %(codes)s::int[], %(latencies)s::int[], %(excerpts)s::text[])
            AS o(id, number, started_at, status_code, latency_ms, excerpt)
    ), delivered AS (
        UPDATE webhook_deliveries AS d
           SET status = 'delivered', attempts = o.number, attempt_started_at = NULL,
               last_status_code = o.status_code, last_latency_ms = o.latency_ms,
               last_error = '', finished_at = %(now)s, next_attempt_at = NULL,
               scheduled_run_id = NULL
          FROM endpoint, outcome AS o
         WHERE d.id = o.id AND d.endpoint_id = endpoint.id
           AND d.status = 'pending' AND d.scheduled_run_id = %(run_id)s
     RETURNING d.id
    ), attempt AS (
        INSERT INTO webhook_attempts
               (delivery_id, number, started_at, status_code, latency_ms, error,
                response_excerpt)
        SELECT o.id, o.number, o.started_at, o.status_code, o.latency_ms, '', o.excerpt
          FROM outcome AS o JOIN delivered ON delivered.id = o.id
     RETURNING delivery_id
    ), unsent AS (
        UPDATE webhook_deliveries SET attempt_started_at = NULL
         WHERE id = ANY(%(unsent)s::bigint[]) AND status = 'pending'
           AND scheduled_run_id = %(run_id)s
     RETURNING id
    )
    SELECT recorded, next.id,
           (SELECT count(pg_advisory_unlock({ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id="x")}))
              FROM unnest(outcome.recorded || %(unsent)s::bigint[]) AS x),
           (SELECT count(*) FROM unsent),
           set_config('synchronous_commit',
                      CASE WHEN next.id IS NULL OR cardinality(recorded) = 0
                           THEN 'on' ELSE 'off' END, true)
      FROM (SELECT coalesce(array_agg(delivery_id), '{{}}') AS recorded FROM attempt) AS outcome,
           {_NEXT_OF_RUN}
"""  # noqa: S608 (only the module's own constants are formatted in)


def _begin_batch(run_id: uuid.UUID, tried: list[int], size: int) -> list[_Request]:
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            _BEGIN_BATCH,
            {"run_id": run_id, "tried": tried, "size": size, **_guard_times(now)},
        )
        rows = cursor.fetchall()
    # A delivery whose attempt another holder of the run has in flight is left to it.
    rows = [row for row in rows if row[-2]]
    if not rows:
        return []
    _, _, _, _, endpoint_id, url, secret, previous, expires, _, _ = rows[0]
    secrets = WebhookEndpoint(
        secret=_unsealed(secret),
        previous_secret=_unsealed(previous),
        previous_secret_expires_at=expires,
    ).signing_secrets(now)
    return [
        _Request(
            delivery_id=delivery_id,
            endpoint_id=endpoint_id,
            url=url,
            body=body,
            message_id=message_id,
            secrets=secrets,
            number=attempts + 1,
        )
        for delivery_id, body, message_id, attempts, *_ in rows
    ]


def _record_batch(
    run_id: uuid.UUID,
    endpoint_id: int,
    sent: list[tuple[_Request, datetime, transport.Answer]],
    unsent: list[_Request],
    tried: list[int],
) -> tuple[set[int], int | None, bool]:
    """Record a batch's fast successes together (see ``_RECORD_BATCH``): the deliveries
    recorded, the run's next delivery, and whether the commit waited for the disk."""
    if not sent and not unsent:
        return set(), None, True  # its first answer stopped it: nothing to record together
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD_BATCH,
            {
                "endpoint_id": endpoint_id,
                "run_id": run_id,
                "ids": [request.delivery_id for request, _, _ in sent],
                "numbers": [request.number for request, _, _ in sent],
                "started": [started_at for _, started_at, _ in sent],
                "codes": [answer.status_code for _, _, answer in sent],
                "latencies": [answer.latency_ms for _, _, answer in sent],
                "excerpts": [answer.excerpt[:EXCERPT_CHARS] for _, _, answer in sent],
                "unsent": [request.delivery_id for request in unsent],
                "tried": tried,
                "now": timezone.now(),
            },
        )
        recorded, next_id, _, _, commit = cursor.fetchone()
    return set(recorded), next_id, commit == "on"


def _next_of_run(run_id: uuid.UUID, tried: list[int]) -> int | None:
    """The oldest delivery scheduled on the run that it has not tried yet."""
    return (
        WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING, scheduled_run_id=run_id)
        .exclude(pk__in=tried)
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )


def _flush(delivery_id: int) -> None:
    """Make the run's outcomes durable: a commit that waits for the disk (a row written
    again, the last recorded delivery's, since a commit that wrote nothing does not wait)
    waits for every earlier commit's too."""
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_deliveries SET finished_at = finished_at WHERE id = %s", [delivery_id]
        )


def _hand_on(run_id: uuid.UUID) -> bool:
    """The deliveries still scheduled on a run that stopped short get their way forward,
    decided under their endpoint's row lock as every parking is: held (the endpoint
    disabled); parked (it fails, with a probe kept on its way; or behind a live attempt
    of it, whose outcome takes them up); otherwise a new run, due now. Whether it wrote
    anything (durably).

    Their rows are locked first, waiting for events that are joining the run (each holds
    a row of it FOR SHARE to its commit), then read again until no new one turns up, and
    only then the endpoint's: an event's transaction that holds the endpoint FOR SHARE
    (a failing one's) never waits for these rows (it joins with SKIP LOCKED)."""
    if not _pending_of_run(run_id):
        return False
    with transaction.atomic():
        rest = {delivery.pk: delivery for delivery in _pending_of_run(run_id, lock=True)}
        while more := [d for d in _pending_of_run(run_id, lock=True) if d.pk not in rest]:
            rest.update((delivery.pk, delivery) for delivery in more)
        # One whose attempt another holder of the run has in flight is left to that
        # attempt's record (moved now, its success would go unrecorded and be sent again).
        for pk in _held_elsewhere(list(rest)):
            del rest[pk]
        if not rest:
            return False
        deliveries = sorted(rest.values(), key=lambda delivery: delivery.pk)
        endpoint = WebhookEndpoint.objects.select_for_update(no_key=True).get(
            pk=deliveries[0].endpoint_id
        )
        now = timezone.now()
        failing = endpoint.failing_since is not None
        if not endpoint.is_active or failing or _wait(endpoint, deliveries[0], now) is not None:
            for delivery in deliveries:
                delivery.park()
        else:
            schedule_deliveries(deliveries, delay=None)
            for delivery in deliveries:
                delivery.attempt_started_at = None
        WebhookDelivery.objects.bulk_update(deliveries, _PARKED_FIELDS)
        if endpoint.is_active and failing and not _has_scheduled(endpoint):
            # The endpoint's probe ended with this run: the oldest parked one is next.
            _unpark(endpoint, 1, delay=probe_interval(endpoint, now))
    return True


_PARKED_FIELDS = ["scheduled_run_id", "next_attempt_at", "attempt_started_at"]


def _pending_of_run(run_id: uuid.UUID, *, lock: bool = False) -> list[WebhookDelivery]:
    deliveries = WebhookDelivery.objects.filter(
        status=DeliveryStatus.PENDING, scheduled_run_id=run_id
    ).order_by("id")
    if lock:
        deliveries = deliveries.select_for_update()
    return list(deliveries)


def _hold_attempt(delivery_id: int) -> bool:
    """The attempt's lock taken on this session; False: another session holds it."""
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_try_advisory_lock({ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id='%s')})",
            [delivery_id],
        )
        return cursor.fetchone()[0]


def _attempt_held_elsewhere(delivery_id: int) -> bool:
    """Whether another session holds the attempt's lock now. Read under the delivery's
    row lock, the answer holds until this transaction ends: only a holder of the row takes
    the attempt's lock, and its holder lets it go with the row taken (the record)."""
    return delivery_id in _held_elsewhere([delivery_id])


def _held_elsewhere(delivery_ids: list[int]) -> set[int]:
    """Those of ``delivery_ids`` whose attempt's lock another session holds now (read under
    their row locks: see ``_attempt_held_elsewhere``)."""
    if not delivery_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(_HELD_ELSEWHERE, [delivery_ids])
        return {row[0] for row in cursor.fetchall()}


def _let_go_attempt(delivery_id: int) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT pg_advisory_unlock({ATTEMPT_LOCK_NAMESPACE}, {_LOCK_KEY.format(id='%s')})",
            [delivery_id],
        )


def _wait(endpoint: WebhookEndpoint, delivery: WebhookDelivery, now: datetime) -> float | None:
    """Seconds this attempt must wait, not counted as an attempt (None: go ahead).

    A receiver whose last attempt was delivered fast takes as many attempts at once as the
    workers have slots, until one of them runs past WEBHOOK_SLOW_SECONDS. Any other
    receiver (new, slow, failing) takes one at a time. So a receiver that never answers
    holds one worker slot, and every other tenant's deliveries keep the rest.
    """
    budget = _attempt_budget()
    in_flight = (
        WebhookDelivery.objects.alias(alive=_ALIVE_EXPRESSION)
        .filter(
            endpoint_id=endpoint.pk,
            # Its worker's session holds its lock: an attempt whose worker died is not in
            # flight, nor one older than the request's whole budget (stuck, whatever its
            # session says).
            alive=True,
            attempt_started_at__gt=now - budget,
        )
        .exclude(pk=delivery.pk)
    )
    if endpoint.answers_fast:
        in_flight = in_flight.filter(
            attempt_started_at__lt=now - timedelta(seconds=settings.WEBHOOK_SLOW_SECONDS)
        )
    started = in_flight.order_by("attempt_started_at").values_list("attempt_started_at", flat=True)
    oldest = started.first()
    if oldest is None:
        return None
    if endpoint.failing_since is not None:
        # A failing receiver's attempt in flight is likely to time out: come back when its
        # budget ends, not every few seconds until then.
        return max(
            settings.WEBHOOK_DEFER_SECONDS,
            (oldest + budget - now).total_seconds() + random.uniform(0, 5),
        )
    return settings.WEBHOOK_DEFER_SECONDS


_ALIVE_EXPRESSION = RawSQL(  # noqa: S611 (the module's own constants, no input)
    _ALIVE.format(ns=ATTEMPT_LOCK_NAMESPACE, table='"webhook_deliveries"'),
    [],
    output_field=BooleanField(),
)


# Seconds a run of webhook.deliver keeps in hand past its last attempt's budget, for its
# hand-on and for the worker's bookkeeping around it.
RUN_MARGIN_SECONDS = 5.0


def _attempt_budget() -> timedelta:
    return timedelta(seconds=settings.WEBHOOK_TIMEOUT + 5)


def _record(
    request: _Request, run_id: uuid.UUID, started_at: datetime, answer: transport.Answer
) -> Outcome:
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().get(pk=request.delivery_id)
        if delivery.status != DeliveryStatus.PENDING or delivery.scheduled_run_id != run_id:
            return Outcome.STALE  # only an operator's hand gets here
        endpoint = WebhookEndpoint.objects.select_for_update(no_key=True).get(
            pk=request.endpoint_id
        )
        health_before = _health(endpoint)
        now = timezone.now()
        WebhookAttempt.objects.create(
            delivery=delivery,
            number=request.number,
            started_at=started_at,
            status_code=answer.status_code,
            latency_ms=answer.latency_ms,
            error=answer.error[:EXCERPT_CHARS],
            response_excerpt=answer.excerpt[:EXCERPT_CHARS],
        )
        delivery.record_attempt(
            number=request.number,
            status_code=answer.status_code,
            latency_ms=answer.latency_ms,
            error=answer.error[:EXCERPT_CHARS],
        )
        outcome = _classify(answer)
        endpoint.answers_fast = (
            outcome is Outcome.DELIVERED
            and answer.latency_ms < settings.WEBHOOK_SLOW_SECONDS * 1000
        )
        if outcome is Outcome.DELIVERED:
            delivery.deliver(now=now)
            endpoint.failing_since = None
            _unpark(endpoint, UNPARK_BATCH, delay=None)
        else:
            outcome = _after_failure(endpoint, delivery, now, answer, outcome, run_id)
        delivery.save()
        if _health(endpoint) != health_before:
            # Written only when it changed: a healthy receiver's attempts write no endpoint row.
            endpoint.save(update_fields=_HEALTH_FIELDS)
    _log_outcome(request, outcome, answer)
    return outcome


def _log_outcome(request: _Request, outcome: Outcome, answer: transport.Answer) -> None:
    logger.info(
        "webhook %s attempt %d to endpoint %s: %s (%s, %d ms)",
        request.message_id,
        request.number,
        request.endpoint_id,
        outcome,
        answer.status_code or answer.error,
        answer.latency_ms,
    )


def _after_failure(
    endpoint: WebhookEndpoint,
    delivery: WebhookDelivery,
    now: datetime,
    answer: transport.Answer,
    outcome: Outcome,
    run_id: uuid.UUID,
) -> Outcome:
    """Retry, park or fail the delivery, and keep its endpoint with exactly one probe on
    its way while it has parked deliveries. Under the endpoint's row lock, so that two
    outcomes of the same endpoint decide one after the other. The other deliveries of its
    run do not count as the probe: the run stops here and hands them on (``_hand_on``)."""
    began_failing = endpoint.failing_since is None
    _endpoint_failed(endpoint, now, answer)
    if began_failing:
        # The endpoint's other deliveries waiting for a run (not in flight) are parked: the
        # attempts of a failing receiver would each hold a worker slot until they time out.
        _park_scheduled(endpoint, except_pk=delivery.pk)
    delay = _retry_delay(delivery, endpoint, now, answer) if outcome is Outcome.RETRYING else None
    reason = ""
    if outcome is Outcome.RETRYING and delay is None:
        outcome = Outcome.FAILED  # its schedule is spent
        # Said, or the tenant would read a 503 (or a timeout) as the receiver's last word.
        last = f"HTTP {answer.status_code}" if answer.status_code else answer.error[:EXCERPT_CHARS]
        reason = f"retries spent after {delivery.attempts} attempts; the last: {last}"
    if not endpoint.is_active:
        # Disabled by this failure: held for its enable, as the others are.
        if outcome is Outcome.FAILED:
            delivery.fail(now=now, reason=reason)
            return outcome
        delivery.park()
        return Outcome.HELD
    probe_on_its_way = _has_scheduled(endpoint, except_pk=delivery.pk, except_run=run_id)
    if outcome is Outcome.FAILED:
        delivery.fail(now=now, reason=reason)
        if not probe_on_its_way:
            # The next parked delivery becomes the one whose attempts look for the
            # endpoint's recovery, at the probe's pace.
            _unpark(endpoint, 1, delay=probe_interval(endpoint, now))
        return outcome
    if probe_on_its_way:
        # Another delivery probes the endpoint already: this one waits with the parked.
        delivery.park()
        return Outcome.PARKED
    schedule_delivery(delivery, delay=delay)
    return outcome


def probe_interval(endpoint: WebhookEndpoint, now: datetime) -> float:
    """Seconds between a failing endpoint's probes: a share of how long it has failed, at
    least a second, at most WEBHOOK_PROBE_MAX_SECONDS."""
    failing_for = (now - (endpoint.failing_since or now)).total_seconds()
    return min(settings.WEBHOOK_PROBE_MAX_SECONDS, max(1.0, PROBE_SHARE * failing_for))


_HEALTH_FIELDS = [
    "failing_since",
    "answers_fast",
    "status",
    "disabled_reason",
    "disabled_at",
    "updated_at",
]


def _health(endpoint: WebhookEndpoint) -> tuple:
    return tuple(getattr(endpoint, name) for name in _HEALTH_FIELDS)


def _classify(answer: transport.Answer) -> Outcome:
    code = answer.status_code
    if code is None:
        # No answer: a timeout or a connection error is retried; a refused address is the
        # hub's own rule, which no retry changes.
        return Outcome.FAILED if answer.refused else Outcome.RETRYING
    if 200 <= code < 300:
        return Outcome.DELIVERED
    if code == 429 or code >= 500:
        return Outcome.RETRYING
    return Outcome.FAILED


def _retry_delay(
    delivery: WebhookDelivery, endpoint: WebhookEndpoint, now: datetime, answer: transport.Answer
) -> float | None:
    """Seconds before the next attempt, or None when the schedule is spent.

    The schedule is spent once the delivery made an attempt per delay of it and has been
    trying for at least the schedule's span: a probe, which comes back sooner than its
    schedule says (``probe_interval``), tries for as long as any other delivery, and
    ``span / 1 s`` attempts at most.
    """
    delays = settings.WEBHOOK_RETRY_DELAYS
    number = delivery.attempts
    span = timedelta(seconds=sum(delays))
    if number > len(delays) and now - delivery.created_at >= span:
        return None
    delay = delays[min(number, len(delays)) - 1]
    if endpoint.failing_since is not None:
        delay = min(delay, probe_interval(endpoint, now))
    if answer.retry_after is not None:
        # The receiver's own Retry-After, when longer, within the longest step.
        delay = max(delay, min(answer.retry_after, max(delays)))
    return delay


def _has_scheduled(
    endpoint: WebhookEndpoint, *, except_pk: int | None = None, except_run: uuid.UUID | None = None
) -> bool:
    """Whether a delivery of the endpoint (not ``except_pk``, nor one of run ``except_run``,
    which stopped and hands them on) is scheduled: its probe, while it fails."""
    scheduled = WebhookDelivery.objects.filter(
        endpoint=endpoint, status=DeliveryStatus.PENDING, scheduled_run_id__isnull=False
    )
    if except_pk is not None:
        scheduled = scheduled.exclude(pk=except_pk)
    if except_run is not None:
        scheduled = scheduled.exclude(scheduled_run_id=except_run)
    return scheduled.exists()


def _park_scheduled(endpoint: WebhookEndpoint, *, except_pk: int) -> None:
    """Park the endpoint's scheduled deliveries with no attempt in flight (SKIP LOCKED: one
    a worker holds is starting its attempt, and its outcome will park it)."""
    waiting = list(
        WebhookDelivery.objects.select_for_update(skip_locked=True)
        .filter(
            endpoint=endpoint,
            status=DeliveryStatus.PENDING,
            scheduled_run_id__isnull=False,
            attempt_started_at__isnull=True,
        )
        .exclude(pk=except_pk)
    )
    for delivery in waiting:
        delivery.park()
    WebhookDelivery.objects.bulk_update(
        waiting, ["scheduled_run_id", "next_attempt_at", "attempt_started_at"]
    )


def _unpark(endpoint: WebhookEndpoint, limit: int, *, delay: float | None = None) -> int:
    """Schedule up to ``limit`` parked deliveries of the endpoint, oldest first, due after
    ``delay``, DELIVERIES_PER_RUN to a run. They come at the pace the receiver takes them:
    the slow-receiver guard lets a fast one take them at once and defers them for a slow
    one."""
    parked = list(
        WebhookDelivery.objects.select_for_update(skip_locked=True)
        .filter(endpoint=endpoint, status=DeliveryStatus.PENDING, scheduled_run_id__isnull=True)
        .order_by("id")[:limit]
    )
    for start in range(0, len(parked), DELIVERIES_PER_RUN):
        schedule_deliveries(parked[start : start + DELIVERIES_PER_RUN], delay=delay)
    WebhookDelivery.objects.bulk_update(parked, ["scheduled_run_id", "next_attempt_at"])
    return len(parked)


def delivery_redeliver(*, delivery_id: int, actor: Any) -> WebhookDelivery:
    """An operator's redelivery: a delivered or failed delivery gets one more attempt, due
    now, by a new run (the same body and webhook-id, so a receiver that had it dedupes it).
    Its attempts keep their numbers; a failure of it is retried while the delivery's retry
    schedule lasts, and ends it failed again after. Refused for a pending delivery (on its
    way already) and while its endpoint is disabled (its run would only hold it)."""
    with transaction.atomic():
        delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
        if delivery is None:
            raise NotFound("There is no such delivery.", code="webhook_delivery_not_found")
        endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
        if not endpoint.is_active:
            raise Conflict(
                "Its endpoint is disabled: enable the endpoint first.", code="webhook_disabled"
            )
        delivery.reopen()
        run_id = schedule_delivery(delivery, delay=None)
        delivery.save(
            update_fields=["status", "finished_at", "scheduled_run_id", "next_attempt_at"]
        )
    logger.info(
        "webhook %s redelivered by %s: run %s", delivery.message_id, actor_label(actor), run_id
    )
    return delivery


def deliveries_resume(endpoint: WebhookEndpoint) -> int:
    """The endpoint was enabled, or its address changed: its parked or held deliveries are
    taken up (a batch now; each success takes the next). The caller holds its row lock."""
    return _unpark(endpoint, UNPARK_BATCH)


def _endpoint_failed(endpoint: WebhookEndpoint, now: datetime, answer: transport.Answer) -> None:
    if endpoint.failing_since is None:
        endpoint.failing_since = now
        return
    failing_for = now - endpoint.failing_since
    if endpoint.is_active and failing_for >= timedelta(
        seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS
    ):
        last = f"HTTP {answer.status_code}" if answer.status_code else answer.error[:EXCERPT_CHARS]
        endpoint.disable(
            reason=(
                f"Every delivery failed for {failing_for.days} days and "
                f"{failing_for.seconds // 3600} hours, since "
                f"{endpoint.failing_since.isoformat(timespec='seconds')}; the last: {last}."
            )
        )
        # Its pending deliveries are held: parked, each one's run finding it disabled.
        logger.warning("webhook endpoint %s disabled: %s", endpoint.pk, endpoint.disabled_reason)
