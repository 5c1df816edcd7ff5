"""The webhooks' figures on the admin's front page, and a delivery run's outcome: read-only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from webhook.models import EndpointStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint


@dataclass(frozen=True)
class EndpointsHealth:
    # Active endpoints whose every attempt fails since ``failing_since``.
    failing: int
    disabled: int
    oldest_failing_since: datetime | None


def endpoints_health() -> EndpointsHealth:
    failing = WebhookEndpoint.objects.filter(
        status=EndpointStatus.ACTIVE, failing_since__isnull=False
    ).order_by("failing_since")
    oldest = failing.values_list("failing_since", flat=True).first()
    return EndpointsHealth(
        failing=failing.count(),
        disabled=WebhookEndpoint.objects.filter(status=EndpointStatus.DISABLED).count(),
        oldest_failing_since=oldest,
    )


@dataclass(frozen=True)
class RunOutcome:
    """What a ``webhook.deliver`` run did for its delivery: the task succeeds whatever the
    receiver answered (a receiver's failure is the delivery's, retried on its own), so the
    run's status alone says nothing of the webhook."""

    delivery_id: int
    delivery_status: str
    # The attempt made while the run ran (None: none was, e.g. a stale or deferred run).
    attempt_number: int | None
    attempt_status_code: int | None
    attempt_error: str

    @property
    def attempt_delivered(self) -> bool:
        return self.attempt_status_code is not None and 200 <= self.attempt_status_code < 300

    def __str__(self) -> str:
        if self.attempt_number is None:
            made = "no attempt by this run"
        else:
            answer = (
                f"HTTP {self.attempt_status_code}"
                if self.attempt_status_code is not None
                else (self.attempt_error or "no answer")
            )
            result = "delivered" if self.attempt_delivered else "failed"
            made = f"attempt {self.attempt_number} {result} ({answer})"
        return f"delivery {self.delivery_id} {self.delivery_status}: {made}"


def deliver_runs_outcomes(
    runs: dict[str, tuple[int, datetime | None, datetime | None]],
) -> dict[str, RunOutcome]:
    """``runs``: run id -> (its delivery's id, the run's start, its end). The attempt a run
    made is the one its delivery started within the run's time (a run makes one at most)."""
    if not runs:
        return {}
    delivery_ids = {delivery_id for delivery_id, _, _ in runs.values()}
    deliveries = dict(
        WebhookDelivery.objects.filter(pk__in=delivery_ids).values_list("pk", "status")
    )
    attempts: dict[int, list[WebhookAttempt]] = {}
    for attempt in WebhookAttempt.objects.filter(delivery_id__in=delivery_ids).order_by("number"):
        attempts.setdefault(attempt.delivery_id, []).append(attempt)
    outcomes = {}
    for run_id, (delivery_id, started_at, finished_at) in runs.items():
        if delivery_id not in deliveries:
            continue
        made = None
        if started_at is not None:
            made = next(
                (
                    a
                    for a in attempts.get(delivery_id, [])
                    if a.started_at >= started_at
                    and (finished_at is None or a.started_at <= finished_at)
                ),
                None,
            )
        outcomes[run_id] = RunOutcome(
            delivery_id=delivery_id,
            delivery_status=deliveries[delivery_id],
            attempt_number=made.number if made else None,
            attempt_status_code=made.status_code if made else None,
            attempt_error=made.error if made else "",
        )
    return outcomes
