"""The delivery engine: a tenant's events delivered to its webhook endpoints.

Deliveries are born in ``deliveries_record``, the outbox's event listener, inside the
transaction that records the event; each is then attempted by a run of ``webhook.deliver``
(``delivery_attempt``), and each retry is a new run, due after the next delay of
``WEBHOOK_RETRY_DELAYS``. The HTTP request happens outside any transaction.
"""

from __future__ import annotations

import json
import logging
import random
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from job.api.serializers import JobOutput
from job.selectors import job_get
from outbox.listeners import RecordedEvent
from outbox.services import dispatch
from webhook import transport
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import DeliveryStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhook.signing import new_message_id, signed_headers

logger = logging.getLogger("hubdommed.webhook")

DELIVER_TASK = "webhook.deliver"
# Characters of a receiver's answer kept with the attempt.
EXCERPT_CHARS = 1024
# Parked deliveries taken up per success of their endpoint, and seconds between them.
UNPARK_BATCH = 100
UNPARK_SPACING = 0.05


# --- the event listener -------------------------------------------------------------------


def deliveries_record(event: RecordedEvent) -> list[int]:
    """One delivery per active endpoint of the event's tenant that wants it, with its first
    run, in the event's own transaction (the outbox calls this from ``publish``)."""
    if event.tenant_id is None or event.type not in TENANT_EVENT_TYPES:
        # The hub's own events (a task that failed) are not the tenant's, even for an
        # endpoint whose row names one (written before the rule, or by hand).
        return []
    endpoints = list(
        WebhookEndpoint.objects.filter(
            tenant_id=event.tenant_id,
            status=WebhookEndpoint.Status.ACTIVE,
            event_types__contains=[event.type],
        ).only("id", "failing_since")
    )
    if not endpoints:
        return []
    body = _body(event)
    # Its own savepoint (taken only for a tenant with endpoints that want the event): a
    # failure here leaves none of these rows, and ``publish`` undoes the event.
    with transaction.atomic():
        deliveries = [
            WebhookDelivery(
                endpoint_id=endpoint.pk,
                tenant_id=event.tenant_id,
                event_id=event.id,
                event_type=event.type,
                message_id=new_message_id(),
                body=body,
            )
            for endpoint in endpoints
        ]
        WebhookDelivery.objects.bulk_create(deliveries)
        failing = {endpoint.pk for endpoint in endpoints if endpoint.failing_since is not None}
        scheduled = [delivery for delivery in deliveries if delivery.endpoint_id not in failing]
        for delivery in scheduled:
            delivery.scheduled_run_id = _schedule(delivery, delay=None)
        # A failing endpoint's new deliveries are parked: its next success takes them up.
        WebhookDelivery.objects.bulk_update(scheduled, ["scheduled_run_id"])
    return [delivery.pk for delivery in deliveries]


def _body(event: RecordedEvent) -> str:
    data: dict[str, Any] = {"event_id": event.id, **event.payload}
    job_id = event.payload.get("job_id") if event.aggregate_type == "Job" else None
    if isinstance(job_id, int):
        job = job_get(tenant=event.tenant_id, job_id=job_id)
        data["job"] = JobOutput(job).data if job is not None else None
    body = {"type": event.type, "timestamp": event.occurred_at.isoformat(), "data": data}
    return json.dumps(body, separators=(",", ":"), default=str)


def _schedule(delivery: WebhookDelivery, *, delay: float | None) -> uuid.UUID:
    return dispatch(
        DELIVER_TASK, {"delivery_id": delivery.pk}, tenant=delivery.tenant_id, delay=delay
    )


# --- one attempt --------------------------------------------------------------------------


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRYING = "retrying"
    FAILED = "failed"
    # Not attempted: another run's business, the endpoint gone, or a slow receiver's turn.
    STALE = "stale"
    CANCELED = "canceled"
    DEFERRED = "deferred"
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
    """Make the attempt that run ``run_id`` was scheduled for, and record what came of it."""
    request = _begin(delivery_id, run_id)
    if isinstance(request, Outcome):
        return request
    started_at = timezone.now()
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
    answer = transport.post(request.url, request.body.encode(), headers)
    return _record(request, run_id, started_at, answer)


@transaction.atomic
def _begin(delivery_id: int, run_id: uuid.UUID) -> _Request | Outcome:
    delivery = WebhookDelivery.objects.select_for_update().filter(pk=delivery_id).first()
    if (
        delivery is None
        or delivery.status != DeliveryStatus.PENDING
        or delivery.scheduled_run_id != run_id
    ):
        return Outcome.STALE
    endpoint = WebhookEndpoint.objects.get(pk=delivery.endpoint_id)
    now = timezone.now()
    if not endpoint.is_active:
        _finish(delivery, DeliveryStatus.FAILED, now, error="endpoint disabled")
        delivery.save()
        return Outcome.CANCELED
    if (
        endpoint.failing_since is not None
        and delivery.attempts == 0
        and delivery.created_at <= endpoint.failing_since
    ):
        # Scheduled before its endpoint began to fail: its first attempt would most likely
        # fail too (and hold a slot until it timed out). It waits for the endpoint's next
        # success, which the retries are there to find, like the deliveries born since
        # (parked from the start; one running now was taken up on purpose).
        delivery.scheduled_run_id = None
        delivery.next_attempt_at = None
        delivery.save(update_fields=["scheduled_run_id", "next_attempt_at"])
        return Outcome.PARKED
    wait = _wait(endpoint, delivery, now)
    if wait is None and not endpoint.answers_fast:
        # One attempt at a time: the endpoint's row is the token. Another delivery holding it
        # is starting an attempt right now, so this one waits, without queueing on the lock
        # (a dead receiver's backlog coming back at once would hold every worker slot).
        locked = (
            WebhookEndpoint.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(pk=endpoint.pk)
            .first()
        )
        wait = settings.WEBHOOK_DEFER_SECONDS if locked is None else _wait(locked, delivery, now)
    if wait is not None:
        delivery.scheduled_run_id = _schedule(delivery, delay=wait)
        delivery.next_attempt_at = now + timedelta(seconds=wait)
        delivery.save(update_fields=["scheduled_run_id", "next_attempt_at"])
        return Outcome.DEFERRED
    delivery.attempt_started_at = now
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


def _wait(endpoint: WebhookEndpoint, delivery: WebhookDelivery, now: datetime) -> float | None:
    """Seconds this attempt must wait, not counted as an attempt (None: go ahead).

    (A failing endpoint's new deliveries do not get here: they are parked until it answers.)
    A receiver whose last attempt was delivered fast takes as many attempts at once as the
    workers have slots, until one of them runs past WEBHOOK_SLOW_SECONDS. Any other
    receiver (new, slow, failing) takes one at a time. So a receiver that never answers
    holds one worker slot, and every other tenant's deliveries keep the rest.
    """
    budget = timedelta(seconds=settings.WEBHOOK_TIMEOUT + 5)
    in_flight = WebhookDelivery.objects.filter(
        endpoint_id=endpoint.pk,
        # An attempt older than the request's whole budget died with its worker.
        attempt_started_at__gt=now - budget,
    ).exclude(pk=delivery.pk)
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
        delivery.attempts = request.number
        delivery.attempt_started_at = None
        delivery.last_status_code = answer.status_code
        delivery.last_latency_ms = answer.latency_ms
        delivery.last_error = answer.error[:EXCERPT_CHARS]

        outcome = _classify(answer)
        endpoint.answers_fast = (
            outcome is Outcome.DELIVERED
            and answer.latency_ms < settings.WEBHOOK_SLOW_SECONDS * 1000
        )
        if outcome is Outcome.DELIVERED:
            _finish(delivery, DeliveryStatus.DELIVERED, now)
            endpoint.failing_since = None
            _unpark(endpoint, UNPARK_BATCH)
        else:
            if outcome is Outcome.RETRYING:
                delay = _retry_delay(request.number, answer)
                if delay is None:
                    outcome = Outcome.FAILED
                else:
                    delivery.scheduled_run_id = _schedule(delivery, delay=delay)
                    delivery.next_attempt_at = now + timedelta(seconds=delay)
            if outcome is Outcome.FAILED:
                _finish(delivery, DeliveryStatus.FAILED, now)
                # The next parked delivery becomes the one whose attempts look for the
                # endpoint's recovery.
                _unpark(endpoint, 1)
            _endpoint_failed(endpoint, now, answer)
        delivery.save()
        if _health(endpoint) != health_before:
            # Written only when it changed: a healthy receiver's attempts write no endpoint row.
            endpoint.save(update_fields=_HEALTH_FIELDS)
    logger.info(
        "webhook %s attempt %d to endpoint %s: %s (%s, %d ms)",
        request.message_id,
        request.number,
        request.endpoint_id,
        outcome,
        answer.status_code or answer.error,
        answer.latency_ms,
    )
    return outcome


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


def _retry_delay(attempt_number: int, answer: transport.Answer) -> float | None:
    """Seconds before the next attempt, or None when the schedule is spent."""
    delays = settings.WEBHOOK_RETRY_DELAYS
    if attempt_number > len(delays):
        return None
    delay = delays[attempt_number - 1]
    if answer.retry_after is not None:
        # The receiver's own Retry-After, when longer, within the longest step.
        delay = max(delay, min(answer.retry_after, max(delays)))
    return delay


def _finish(
    delivery: WebhookDelivery, status: DeliveryStatus, now: datetime, *, error: str = ""
) -> None:
    delivery.status = status
    delivery.finished_at = now
    delivery.next_attempt_at = None
    delivery.scheduled_run_id = None
    delivery.attempt_started_at = None
    if error:
        delivery.last_error = error


def _unpark(endpoint: WebhookEndpoint, limit: int) -> int:
    """Schedule up to ``limit`` parked deliveries of the endpoint, oldest first, spread
    over a moment so that they do not all arrive at once."""
    parked = list(
        WebhookDelivery.objects.select_for_update(skip_locked=True)
        .filter(endpoint=endpoint, status=DeliveryStatus.PENDING, scheduled_run_id__isnull=True)
        .order_by("id")[:limit]
    )
    for position, delivery in enumerate(parked):
        delay = position * UNPARK_SPACING
        delivery.scheduled_run_id = _schedule(delivery, delay=delay or None)
        delivery.next_attempt_at = timezone.now() + timedelta(seconds=delay)
    WebhookDelivery.objects.bulk_update(parked, ["scheduled_run_id", "next_attempt_at"])
    return len(parked)


def _cancel_parked(endpoint: WebhookEndpoint, now: datetime) -> None:
    WebhookDelivery.objects.filter(
        endpoint=endpoint, status=DeliveryStatus.PENDING, scheduled_run_id__isnull=True
    ).update(status=DeliveryStatus.FAILED, finished_at=now, last_error="endpoint disabled")


def _endpoint_failed(endpoint: WebhookEndpoint, now: datetime, answer: transport.Answer) -> None:
    if endpoint.failing_since is None:
        endpoint.failing_since = now
        return
    failing_for = now - endpoint.failing_since
    if endpoint.is_active and failing_for >= timedelta(
        seconds=settings.WEBHOOK_DISABLE_AFTER_SECONDS
    ):
        last = f"HTTP {answer.status_code}" if answer.status_code else answer.error
        endpoint.disable(
            reason=(
                f"Every delivery failed for {failing_for.days} days and "
                f"{failing_for.seconds // 3600} hours, since "
                f"{endpoint.failing_since.isoformat(timespec='seconds')}; the last: {last}."
            )
        )
        _cancel_parked(endpoint, now)
        logger.warning("webhook endpoint %s disabled: %s", endpoint.pk, endpoint.disabled_reason)
