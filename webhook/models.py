"""A tenant's webhook endpoints and the deliveries of its events to them.

Each matching event becomes one ``WebhookDelivery``, written in the transaction that
records the event. The delivery owns its attempts (``WebhookAttempt``, one row per HTTP
request): attempts are made by runs of the ``webhook.deliver`` task (one run takes many
deliveries of an endpoint, one after another), and a retry is a new outbox row due after
the retry delay. The retry schedule spans a day, past what the task
runtime's own retries (five receives, minutes apart) are for: those stay for the hub's own
failures (the database away), a receiver's failure is the delivery's business.

A delivery's final states are ``DELIVERY_FINAL``; ``DELIVERY_WAYS_FORWARD`` says what moves
each other state (docs/state-machines.md), and ``webhook.stranded`` is the monitor's check
that no delivery is left without it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.utils import timezone

from common.errors import Conflict
from common.models import choices_check
from webhook.secret_box import SealedTextField


class EndpointStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    DISABLED = "disabled", "Disabled"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


DELIVERY_FINAL = (DeliveryStatus.DELIVERED, DeliveryStatus.FAILED)

# What moves a pending delivery, by the shape it is in. Nothing else may leave one there.
DELIVERY_WAYS_FORWARD = {
    "scheduled": (
        "its queued webhook.deliver run (scheduled_run_id, shared with the other deliveries "
        "of its endpoint that joined the run), due at next_attempt_at: the relay sends it, a "
        "worker makes their attempts one after another (a worker lost mid-run: the run's "
        "lease brings the message back); a run that stops short hands what it did not take "
        "on (a new run, parked or held) before it is settled; the monitor's check schedules "
        "a new run for one overdue long past its due time"
    ),
    "parked": (
        "its active endpoint's probe: the one scheduled delivery of a failing endpoint (or "
        "the attempt in flight it was parked behind), whose success takes the parked ones up "
        "(UNPARK_BATCH per success, due at once) and whose end hands the probe on to the "
        "oldest parked one; the monitor's check makes a probe of the oldest when an endpoint "
        "has parked deliveries and none scheduled"
    ),
    "held": (
        "parked while its endpoint is disabled: a manager's enable takes it up again; past "
        "WEBHOOK_HELD_MAX_AGE_SECONDS the monitor's check fails it, with the reason"
    ),
}


class WebhookEndpoint(models.Model):
    Status = EndpointStatus

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("identity.Tenant", on_delete=models.PROTECT, related_name="+")
    url = models.TextField()
    description = models.TextField(blank=True, default="")
    event_types = ArrayField(models.TextField())
    # The signing secret (whsec_ + base64): the hub signs with it, so it must read it back;
    # the column holds it encrypted under WEBHOOK_SECRET_KEYS (webhook.secret_box). Shown to
    # people only when it is made (creation, rotation).
    secret = SealedTextField()
    # After a rotation the old secret keeps signing too (a second signature in the header)
    # until this time, so that receivers can switch without losing a delivery; then it is
    # erased (``forget_previous_secret``, by the webhook.expire_secrets sweep).
    previous_secret = SealedTextField(blank=True, default="")
    previous_secret_expires_at = models.DateTimeField(null=True, blank=True)
    status = models.TextField(choices=EndpointStatus.choices, default=EndpointStatus.ACTIVE)
    disabled_reason = models.TextField(blank=True, default="")
    disabled_at = models.DateTimeField(null=True, blank=True)
    # Since when every attempt failed (null: the last one succeeded). The disabling rule and
    # the slow-receiver guard read it.
    failing_since = models.DateTimeField(null=True, blank=True)
    # Whether the last attempt was delivered within WEBHOOK_SLOW_SECONDS. Only such an endpoint
    # takes several attempts at once; a new, slow or failing one takes them one at a time.
    answers_fast = models.BooleanField(default=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        db_table = "webhook_endpoints"
        constraints = [
            choices_check("webhook_endpoints", "status", EndpointStatus),
        ]
        indexes = [
            # The event listener: a tenant's active endpoints, on every event of the tenant.
            models.Index(
                fields=["tenant"],
                condition=Q(status="active"),
                name="webhook_endpoints_active_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.url} ({self.status})"

    @property
    def is_active(self) -> bool:
        return self.status == EndpointStatus.ACTIVE

    def signing_secrets(self, at: datetime) -> list[str]:
        secrets = [self.secret]
        if (
            self.previous_secret
            and self.previous_secret_expires_at
            and at < (self.previous_secret_expires_at)
        ):
            secrets.append(self.previous_secret)
        return secrets

    # --- transitions ------------------------------------------------------------------

    def rotate(self, *, new_secret: str, grace: timedelta) -> None:
        self._ensure_active("rotated")
        now = timezone.now()
        if grace > timedelta(0):
            self.previous_secret = self.secret
            self.previous_secret_expires_at = now + grace
        else:
            # No grace: the old secret signs nothing more, so it is not kept at all.
            self.previous_secret = ""
            self.previous_secret_expires_at = None
        self.secret = new_secret
        self.updated_at = now

    def forget_previous_secret(self, *, now: datetime) -> bool:
        """Erase the old secret once its grace has ended; whether there was one to erase."""
        if not self.previous_secret or (
            self.previous_secret_expires_at is not None and now < self.previous_secret_expires_at
        ):
            return False
        self.previous_secret = ""
        self.previous_secret_expires_at = None
        return True

    def disable(self, *, reason: str) -> None:
        if not self.is_active:
            raise Conflict("The endpoint is already disabled.", code="webhook_disabled")
        self.status = EndpointStatus.DISABLED
        self.disabled_reason = reason
        self.disabled_at = self.updated_at = timezone.now()

    def enable(self) -> None:
        if self.is_active:
            raise Conflict("The endpoint is already active.", code="webhook_active")
        self.status = EndpointStatus.ACTIVE
        self.disabled_reason = ""
        self.disabled_at = None
        self.failing_since = None
        self.answers_fast = False
        self.updated_at = timezone.now()

    def _ensure_active(self, what: str) -> None:
        if not self.is_active:
            raise Conflict(
                f"A disabled endpoint cannot be {what}; enable it first.", code="webhook_disabled"
            )


class WebhookDelivery(models.Model):
    Status = DeliveryStatus

    id = models.BigAutoField(primary_key=True)
    endpoint = models.ForeignKey(WebhookEndpoint, on_delete=models.PROTECT, related_name="+")
    # The tenant's own, for scoping reads without a join.
    tenant = models.ForeignKey("identity.Tenant", on_delete=models.PROTECT, related_name="+")
    # The event's row in the outbox's trail (events.id).
    event_id = models.BigIntegerField()
    event_type = models.TextField()
    # The webhook-id header: the same on every attempt, so that the receiver can dedupe.
    message_id = models.TextField(unique=True)
    # The exact body sent, fixed when the event is recorded: every attempt sends these bytes.
    body = models.TextField()
    status = models.TextField(choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING)
    attempts = models.PositiveIntegerField(default=0)
    # The outbox run that may make the next attempt (many deliveries of an endpoint share
    # one): a run with another id is stale (a duplicate, or superseded by a deferral) and
    # does nothing for it. Null while pending: parked, waiting for its failing endpoint's
    # probe to succeed, or held while it is disabled.
    scheduled_run_id = models.UUIDField(null=True, blank=True)
    # Set while an attempt is in flight; the slow-receiver guard counts these.
    attempt_started_at = models.DateTimeField(null=True, blank=True)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_latency_ms = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "webhook_deliveries"
        verbose_name_plural = "webhook deliveries"
        constraints = [
            choices_check("webhook_deliveries", "status", DeliveryStatus),
            # One delivery per event and endpoint, however often the listener runs.
            models.UniqueConstraint(
                fields=["endpoint", "event_id"], name="webhook_deliveries_event_uniq"
            ),
        ]
        indexes = [
            # The API's list of an endpoint's recent deliveries, newest first.
            models.Index(
                fields=["endpoint", "-created_at", "-id"], name="webhook_deliveries_recent_idx"
            ),
            # A failing endpoint's parked deliveries, taken up again when it answers.
            models.Index(
                fields=["endpoint", "id"],
                condition=Q(status="pending", scheduled_run_id__isnull=True),
                name="webhook_deliveries_parked_idx",
            ),
            # An endpoint's scheduled deliveries, newest first: the run a new delivery joins
            # (the event listener), and a probe's search (the stranded check's, and the
            # event listener's while its endpoint fails).
            models.Index(
                fields=["endpoint", "id"],
                condition=Q(status="pending", scheduled_run_id__isnull=False),
                name="webhook_deliveries_newest_idx",
            ),
            # A run's deliveries, oldest first: the run takes them one after another.
            models.Index(
                fields=["scheduled_run_id", "id"],
                condition=Q(status="pending", scheduled_run_id__isnull=False),
                name="webhook_deliveries_run_idx",
            ),
            # The stranded check: scheduled deliveries long past their due time.
            models.Index(
                fields=["next_attempt_at"],
                condition=Q(status="pending", scheduled_run_id__isnull=False),
                name="webhook_deliveries_due_idx",
            ),
            # The slow-receiver guard: an endpoint's attempts in flight.
            models.Index(
                fields=["endpoint", "attempt_started_at"],
                condition=Q(attempt_started_at__isnull=False),
                name="webhook_deliveries_flight_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.message_id} {self.event_type} ({self.status})"

    @property
    def is_final(self) -> bool:
        return self.status in DELIVERY_FINAL

    @property
    def is_parked(self) -> bool:
        return self.status == DeliveryStatus.PENDING and self.scheduled_run_id is None

    # --- transitions ------------------------------------------------------------------
    # Every one leaves ``pending`` (scheduled or parked) and enters the state it names; the
    # caller holds the row's lock and saves it. ``pending`` is the only state with moves.

    def schedule(self, *, run_id: uuid.UUID, due_at: datetime) -> None:
        """pending (parked, or scheduled for another run) -> pending, scheduled for
        ``run_id``: any other run of it becomes stale and does nothing."""
        self._ensure_pending("scheduled")
        self.scheduled_run_id = run_id
        self.next_attempt_at = due_at

    def park(self) -> None:
        """pending, scheduled -> pending, parked (or held, its endpoint disabled): its run
        becomes stale; its endpoint's probe (or enable) takes it up again."""
        self._ensure_pending("parked")
        self.scheduled_run_id = None
        self.next_attempt_at = None
        self.attempt_started_at = None

    def begin_attempt(self, *, now: datetime) -> None:
        """pending, scheduled -> pending, scheduled with an attempt in flight (counted by the
        slow-receiver guard until it is recorded or its budget ends)."""
        self._ensure_pending("attempted")
        if self.scheduled_run_id is None:
            raise Conflict("A parked delivery has no run to attempt it.", code="webhook_parked")
        self.attempt_started_at = now

    def record_attempt(
        self, *, number: int, status_code: int | None, latency_ms: int, error: str
    ) -> None:
        """pending -> pending: what the attempt got; the caller then delivers, fails, parks
        or schedules it."""
        self._ensure_pending("attempted")
        self.attempts = number
        self.attempt_started_at = None
        self.last_status_code = status_code
        self.last_latency_ms = latency_ms
        self.last_error = error

    def deliver(self, *, now: datetime) -> None:
        """pending -> delivered (final)."""
        self._ensure_pending("delivered")
        self._finish(DeliveryStatus.DELIVERED, now)

    def fail(self, *, now: datetime, reason: str = "") -> None:
        """pending -> failed (final), with ``reason`` when the last attempt does not say it."""
        self._ensure_pending("failed")
        self._finish(DeliveryStatus.FAILED, now)
        if reason:
            self.last_error = reason

    def reopen(self) -> None:
        """delivered or failed (final) -> pending, parked: an operator's redelivery, which
        schedules it next (``delivery_redeliver``). Its attempts keep their numbers."""
        if self.status not in DELIVERY_FINAL:
            raise Conflict(
                "A pending delivery is on its way already: it cannot be redelivered.",
                code="webhook_delivery_pending",
            )
        self.status = DeliveryStatus.PENDING
        self.finished_at = None

    def _finish(self, status: DeliveryStatus, now: datetime) -> None:
        self.status = status
        self.finished_at = now
        self.next_attempt_at = None
        self.scheduled_run_id = None
        self.attempt_started_at = None

    def _ensure_pending(self, what: str) -> None:
        if self.status != DeliveryStatus.PENDING:
            raise Conflict(
                f"A {self.status} delivery cannot be {what}.", code="webhook_delivery_final"
            )


class WebhookAttempt(models.Model):
    """One HTTP request of a delivery: what the receiver answered, and how fast."""

    id = models.BigAutoField(primary_key=True)
    delivery = models.ForeignKey(WebhookDelivery, on_delete=models.CASCADE, related_name="+")
    number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    # Null when no answer came (timeout, connection refused, address refused).
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    latency_ms = models.PositiveIntegerField()
    error = models.TextField(blank=True, default="")
    # The beginning of the receiver's answer, for whoever looks into a failure.
    response_excerpt = models.TextField(blank=True, default="")

    class Meta:
        db_table = "webhook_attempts"
        constraints = [
            models.UniqueConstraint(
                fields=["delivery", "number"], name="webhook_attempts_number_uniq"
            ),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}: {self.status_code}"
