"""The ways-forward check of webhook deliveries (``common.ways_forward``, machine
``webhook_deliveries``).

A pending delivery is moved by its queued run (scheduled), by its endpoint's probe
(parked), or by its endpoint's enable and the held bound (held, its endpoint disabled):
``webhook.models.DELIVERY_WAYS_FORWARD``. Three shapes break that, and the check gives
each its way forward again:

* parked while its active endpoint has no scheduled delivery (no probe): the oldest parked
  one is scheduled as the probe (all of a batch, when the endpoint is not failing).
  Only deliveries parked for longer than ``MARGIN`` count: the engine decides parking under
  the endpoint's row lock, so none should be young, but a row is never judged in passing.
* scheduled, and its run long overdue (``overdue_after``: twice the outbox's own stranded
  bound, by which the outbox's check has re-armed or failed the run): the run died without
  its attempt (dead-lettered, lost). A new run is scheduled; the old one, if it ever comes,
  is stale.
* held past ``WEBHOOK_HELD_MAX_AGE_SECONDS`` (its endpoint disabled all that time): it
  ends failed, with the reason.

An endpoint cannot be stranded itself: nothing waits on it (its deliveries carry the work).
Each repair is its own short transaction under SKIP LOCKED (a row a worker holds is moving),
checked again under the lock; each shape reads ``BATCH`` rows per cycle at most.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef
from django.utils import timezone

from common.ways_forward import Repaired
from webhook.delivery import UNPARK_BATCH, _unpark, probe_interval, schedule_delivery
from webhook.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint

# Rows (or endpoints) one check repairs at most per shape; the next cycle takes the rest.
BATCH = 100
# How long a delivery is parked before a missing probe counts as stranding it.
MARGIN = timedelta(seconds=60)


def overdue_after() -> timedelta:
    return 2 * timedelta(seconds=settings.MONITOR_STRANDED_RUN_SECONDS)


def deliveries_stranded() -> list[Repaired]:
    now = timezone.now()
    return _without_probe(now) + _run_overdue(now) + _held_too_long(now)


def _pending():
    return WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING)


def _without_probe(now: datetime) -> list[Repaired]:
    parked_long = _pending().filter(
        endpoint=OuterRef("pk"), scheduled_run_id__isnull=True, created_at__lt=now - MARGIN
    )
    scheduled = _pending().filter(endpoint=OuterRef("pk"), scheduled_run_id__isnull=False)
    endpoint_ids = list(
        WebhookEndpoint.objects.filter(status=WebhookEndpoint.Status.ACTIVE)
        .filter(Exists(parked_long), ~Exists(scheduled))
        .order_by("id")
        .values_list("id", flat=True)[:BATCH]
    )
    repaired = []
    for endpoint_id in endpoint_ids:
        with transaction.atomic():
            endpoint = (
                WebhookEndpoint.objects.select_for_update(no_key=True, skip_locked=True)
                .filter(pk=endpoint_id, status=WebhookEndpoint.Status.ACTIVE)
                .first()
            )
            if (
                endpoint is None
                or _pending().filter(endpoint=endpoint, scheduled_run_id__isnull=False).exists()
            ):
                continue  # an attempt holds it, or a probe is on its way now
            failing = endpoint.failing_since is not None
            limit = 1 if failing else UNPARK_BATCH
            delay = probe_interval(endpoint, now) if failing else None
            taken = list(
                _pending()
                .filter(endpoint=endpoint, scheduled_run_id__isnull=True)
                .order_by("id")
                .values_list("id", flat=True)[:limit]
            )
            _unpark(endpoint, limit, delay=delay)
        action = (
            "scheduled as its failing endpoint's probe"
            if failing
            else "scheduled (its endpoint answers)"
        )
        repaired.extend(
            Repaired(
                f"webhook delivery {pk}",
                f"parked, and its endpoint {endpoint_id} has no delivery on its way",
                action,
            )
            for pk in taken
        )
    return repaired


def _run_overdue(now: datetime) -> list[Repaired]:
    cutoff = now - overdue_after()
    budget = timedelta(seconds=settings.WEBHOOK_TIMEOUT + 5)
    late = list(
        _pending()
        .filter(scheduled_run_id__isnull=False, next_attempt_at__lt=cutoff)
        .order_by("next_attempt_at", "id")
        .values_list("id", flat=True)[:BATCH]
    )
    repaired = []
    for pk in late:
        with transaction.atomic():
            delivery = (
                _pending()
                .select_for_update(skip_locked=True)
                .filter(pk=pk, scheduled_run_id__isnull=False, next_attempt_at__lt=cutoff)
                .first()
            )
            if delivery is None:
                continue
            if delivery.attempt_started_at and delivery.attempt_started_at > now - budget:
                continue  # its attempt is in flight right now
            was_due = delivery.next_attempt_at
            schedule_delivery(delivery, delay=None)
            delivery.attempt_started_at = None
            delivery.save(
                update_fields=["scheduled_run_id", "next_attempt_at", "attempt_started_at"]
            )
        repaired.append(
            Repaired(
                f"webhook delivery {pk}",
                f"scheduled, due since {was_due.isoformat()}, and its run never made the attempt",
                "a new run scheduled, due now (the old one is stale if it comes)",
            )
        )
    return repaired


def _held_too_long(now: datetime) -> list[Repaired]:
    max_age = timedelta(seconds=settings.WEBHOOK_HELD_MAX_AGE_SECONDS)
    held = list(
        _pending()
        .filter(
            scheduled_run_id__isnull=True,
            created_at__lt=now - max_age,
            endpoint__status=WebhookEndpoint.Status.DISABLED,
        )
        .order_by("id")
        .values_list("id", flat=True)[:BATCH]
    )
    reason = (
        f"held for longer than {settings.WEBHOOK_HELD_MAX_AGE_SECONDS} s "
        "(WEBHOOK_HELD_MAX_AGE_SECONDS) while its endpoint was disabled"
    )
    repaired = []
    for pk in held:
        with transaction.atomic():
            delivery = (
                _pending()
                .select_for_update(skip_locked=True, of=("self",))
                .filter(
                    pk=pk,
                    scheduled_run_id__isnull=True,
                    endpoint__status=WebhookEndpoint.Status.DISABLED,
                )
                .first()
            )
            if delivery is None:
                continue
            delivery.fail(now=now, reason=reason)
            delivery.save()
        repaired.append(
            Repaired(
                f"webhook delivery {pk}",
                "held while its endpoint is disabled, past the held bound",
                f"failed: {reason}",
            )
        )
    return repaired
