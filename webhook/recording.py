"""An event becomes its deliveries: the outbox's event listener for a tenant's webhooks.

``deliveries_record`` runs inside the transaction that records the event (the outbox calls
it from ``publish``, and only where ``deliveries_wanted``, asked by the event's own
statement, found an active endpoint of the tenant that wants the event). It writes one
delivery per such endpoint, each joining its endpoint's run of ``webhook.deliver`` that is
due and not at work yet (up to ``DELIVERIES_PER_RUN``) or taking a new one; a failing
endpoint with its probe on the way gets its delivery parked instead. What becomes of a
delivery then, its attempts, retries and parking, is the delivery engine's
(``webhook.delivery``).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from job.selectors import job_get, job_public
from outbox.listeners import Condition, RecordedEvent
from webhook.delivery import DELIVERIES_PER_RUN, schedule_delivery
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import DeliveryStatus, WebhookDelivery, WebhookEndpoint
from webhook.signing import new_message_id


def deliveries_wanted(event_type: str, tenant_id: int | None) -> Condition | None:
    """The listener's interest: whether some active endpoint of the tenant wants such an
    event, asked by the event's own statement (``deliveries_record`` reads them only
    then); None for an event that is not the tenant's."""
    if tenant_id is None or event_type not in TENANT_EVENT_TYPES:
        return None
    return Condition(_ENDPOINT_WANTS, (tenant_id, event_type))


# The index of the tenant's active endpoints answers it (see the model's indexes).
_ENDPOINT_WANTS = (
    "SELECT EXISTS (SELECT 1 FROM webhook_endpoints WHERE tenant_id = %s "
    "AND status = 'active' AND event_types @> ARRAY[%s]::text[])"
)


def deliveries_record(event: RecordedEvent) -> list[int]:
    """One delivery per active endpoint of the event's tenant that wants it, with its first
    run, in the event's own transaction (the outbox calls this from ``publish``); parked
    instead for an endpoint that is failing and has its probe on the way."""
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
        parking = _endpoints_parking(
            [endpoint.pk for endpoint in endpoints if endpoint.failing_since is not None]
        )
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
        scheduled = [delivery for delivery in deliveries if delivery.endpoint_id not in parking]
        runs = _runs_to_join([delivery.endpoint_id for delivery in scheduled])
        for delivery in scheduled:
            joined = runs.get(delivery.endpoint_id)
            if joined is None:
                schedule_delivery(delivery, delay=None)
            else:
                delivery.schedule(run_id=joined[0], due_at=joined[1])
        WebhookDelivery.objects.bulk_update(scheduled, ["scheduled_run_id", "next_attempt_at"])
    return [delivery.pk for delivery in deliveries]


def deliveries_record_many(events: list[RecordedEvent]) -> list[int]:
    """``deliveries_record`` for the events of one ``publish_many`` (a scheduler's batch of
    jobs, for one): the endpoints of all their tenants read in one statement, and only
    the events some endpoint wants go on to be recorded one by one."""
    wanted = [
        event
        for event in events
        if event.tenant_id is not None and event.type in TENANT_EVENT_TYPES
    ]
    if not wanted:
        return []
    subscribed: dict[int, set[str]] = {}
    for tenant_id, event_types in WebhookEndpoint.objects.filter(
        tenant_id__in={event.tenant_id for event in wanted},
        status=WebhookEndpoint.Status.ACTIVE,
    ).values_list("tenant_id", "event_types"):
        subscribed.setdefault(tenant_id, set()).update(event_types)
    recorded: list[int] = []
    for event in wanted:
        if event.type in subscribed.get(event.tenant_id, ()):
            recorded.extend(deliveries_record(event))
    return recorded


def _endpoints_parking(endpoint_ids: list[int]) -> set[int]:
    """Of these endpoints (read as failing without a lock), those still failing with a
    probe on its way: their new deliveries are parked.

    FOR SHARE, held to the event's commit: an attempt's outcome (which takes the row FOR NO
    KEY UPDATE, and un-parks on a success) waits for this transaction, and so sees its
    parked rows; or it committed first, and the row read here is the one it left (READ
    COMMITTED reads the latest version once the lock is had). A failing endpoint with no
    probe (its last one just ended) gets this event's delivery as its probe.
    """
    if not endpoint_ids:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM webhook_endpoints WHERE id = ANY(%s) AND status = 'active' "
            "AND failing_since IS NOT NULL ORDER BY id FOR SHARE",
            [endpoint_ids],
        )
        failing = [row[0] for row in cursor.fetchall()]
    probing = set(
        WebhookDelivery.objects.filter(
            endpoint_id__in=failing,
            status=DeliveryStatus.PENDING,
            scheduled_run_id__isnull=False,
        ).values_list("endpoint_id", flat=True)
    )
    return probing


# The run a new delivery joins: its endpoint's newest delivery that is scheduled, due and
# not begun, locked FOR SHARE until the event's commit, if its run holds fewer than
# DELIVERIES_PER_RUN and none of them is begun (a run at work, or one whose worker died in
# the middle of it: a new delivery never waits for a dead run's lease). The run's worker
# begins that delivery (an UPDATE of its row) after this commit, so it finds the new one
# among its deliveries; or it began it before, and the lock finds it begun (READ
# COMMITTED checks the row's latest version once the lock is had) and the new delivery
# takes a run of its own. SKIP LOCKED: a delivery a run is
# beginning or handing on right now is passed over, so an event never waits for a worker.
_RUNS_TO_JOIN = """
    SELECT e.id, d.scheduled_run_id, d.next_attempt_at
      FROM unnest(%(endpoints)s::bigint[]) AS e(id)
     CROSS JOIN LATERAL (
           SELECT o.scheduled_run_id, o.next_attempt_at
             FROM webhook_deliveries AS o
            WHERE o.endpoint_id = e.id AND o.status = 'pending'
              AND o.scheduled_run_id IS NOT NULL AND o.attempt_started_at IS NULL
              AND o.next_attempt_at <= %(now)s
            ORDER BY o.id DESC
            LIMIT 1
              FOR SHARE SKIP LOCKED) AS d
     WHERE NOT EXISTS (
               SELECT 1 FROM webhook_deliveries AS m
                WHERE m.scheduled_run_id = d.scheduled_run_id AND m.status = 'pending'
                  AND m.attempt_started_at IS NOT NULL)
       AND (SELECT count(*) FROM (
                SELECT 1 FROM webhook_deliveries AS m
                 WHERE m.scheduled_run_id = d.scheduled_run_id AND m.status = 'pending'
                 LIMIT %(most)s) AS members) < %(most)s
"""


def _runs_to_join(endpoint_ids: list[int]) -> dict[int, tuple[uuid.UUID, datetime]]:
    """For each endpoint, the run due now that its new delivery joins (and the run's due
    time), if it has one with room: see ``_RUNS_TO_JOIN``."""
    if not endpoint_ids:
        return {}
    with connection.cursor() as cursor:
        cursor.execute(
            _RUNS_TO_JOIN,
            {"endpoints": endpoint_ids, "now": timezone.now(), "most": DELIVERIES_PER_RUN},
        )
        return {endpoint_id: (run_id, due_at) for endpoint_id, run_id, due_at in cursor}


def _body(event: RecordedEvent) -> str:
    data: dict[str, Any] = {"event_id": event.id, **event.payload}
    job_id = event.payload.get("job_id") if event.aggregate_type == "Job" else None
    if isinstance(job_id, int):
        job = job_get(tenant=event.tenant_id, job_id=job_id)
        data["job"] = job_public(job) if job is not None else None
    body = {"type": event.type, "timestamp": event.occurred_at.isoformat(), "data": data}
    return json.dumps(body, separators=(",", ":"), default=str)
