"""The outbox write path: ``dispatch`` and ``publish``.

Both run inside the caller's transaction and write everything the change
causes: the outbox row(s), their ``task_runs`` rows (``queued``) and, for an
event, its row in the ``events`` trail. A message addressed to an automation's own
worker gets no ``task_runs`` row: that worker has no database and never settles a
run, which would stay ``queued`` forever. If the caller's transaction rolls
back, none of it exists; if it commits, all of it does. Only the Redis wake
signal waits for the commit (``transaction.on_commit``).

Envelope (the JSON the broker carries; version 1)::

    {"version": 1, "run_id": "…", "task": "machines.power_on", "queue": "critical",
     "destination": "critical", "event": "JobCreated" | null, "event_id": 17 | null,
     "tenant": 3 | null, "payload": {…}, "occurred_at": "…", "correlation_id": "…"}

``destination`` is the queue the message belongs to, without the environment's
prefix: the queue class, or ``automation-<id>`` for an automation's own worker.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import models, transaction
from django.utils import timezone

from broker.topology import automation_queue_name
from common.context import get_correlation_id
from outbox.catalog import TaskSpec, get_catalog
from outbox.listeners import RecordedEvent, notify_listeners
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun, clock_timestamp
from outbox.wake import signal_relay_on_commit

ENVELOPE_VERSION = 1


class OutboxError(Exception):
    """A misuse of the outbox: nothing was written."""


class NotInTransaction(OutboxError):
    pass


class InvalidPayload(OutboxError):
    pass


class EnvelopeTooLarge(OutboxError):
    pass


@dataclass(frozen=True)
class Published:
    """What ``publish`` recorded: the event's trail row and one run per subscriber."""

    event_id: int
    run_ids: tuple[uuid.UUID, ...]


def dispatch(
    task: str,
    payload: Mapping[str, Any],
    *,
    tenant: Any = None,
    delay: timedelta | float | None = None,
) -> uuid.UUID:
    """Record one run of ``task``, due now or after ``delay``. Returns its run_id."""
    _require_transaction()
    spec = get_catalog().task(task)
    body = _json_object(payload)
    (run_id,) = _write_runs(
        [spec], body, tenant_id=_id_of(tenant), event=None, event_id=None, delay=delay
    )
    return run_id


def publish(
    event: str,
    payload: Mapping[str, Any],
    *,
    tenant: Any = None,
    aggregate: Any,
    actor: Any = None,
) -> Published:
    """Record a domain event in the trail and one run per subscriber of it.

    ``aggregate`` is a model instance or a ``(type, id)`` pair; ``actor`` a user,
    a worker, a string (``"system"``) or None (``"system"``).
    """
    _require_transaction()
    subscribers = get_catalog().subscribers(event)
    body = _json_object(payload)
    aggregate_type, aggregate_id = _aggregate_key(aggregate)
    tenant_id = _id_of(tenant)
    # A savepoint, so that a refusal found while writing (an envelope too large, a
    # payload missing its routing key) leaves no trail row behind either.
    with transaction.atomic():
        return _publish(event, body, subscribers, tenant_id, aggregate_type, aggregate_id, actor)


def _publish(
    event: str,
    body: str,
    subscribers: list[TaskSpec],
    tenant_id: int | None,
    aggregate_type: str,
    aggregate_id: str,
    actor: Any,
) -> Published:
    record = Event.objects.create(
        type=event,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        tenant_id=tenant_id,
        actor=actor_label(actor),
        payload=json.loads(body),
        correlation_id=get_correlation_id(),
    )
    run_ids = _write_runs(
        subscribers, body, tenant_id=tenant_id, event=event, event_id=record.id, delay=None
    )
    notify_listeners(
        RecordedEvent(
            id=record.id,
            type=event,
            tenant_id=tenant_id,
            aggregate_type=aggregate_type,
            aggregate_id=aggregate_id,
            payload=record.payload,
            occurred_at=_occurred_at(record),
        )
    )
    return Published(event_id=record.id, run_ids=tuple(run_ids))


def _occurred_at(record: Event):
    # The database's clock stamps the row; a backend that does not return it on insert
    # leaves the listeners the application's clock, a moment later.
    occurred_at = record.occurred_at
    return occurred_at if isinstance(occurred_at, datetime) else timezone.now()


def actor_label(actor: Any) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    model = getattr(actor, "_meta", None)
    if model is not None and getattr(actor, "pk", None) is not None:
        return f"{model.model_name}:{actor.pk}"
    raise TypeError(f"cannot name actor {actor!r}")


def _write_runs(
    specs: Iterable[TaskSpec],
    body: str,
    *,
    tenant_id: int | None,
    event: str | None,
    event_id: int | None,
    delay: timedelta | float | None,
) -> list[uuid.UUID]:
    specs = list(specs)
    if not specs:
        return []
    payload = json.loads(body)
    correlation_id = get_correlation_id()
    occurred_at = timezone.now().isoformat()
    available_at = _available_at(delay)
    model = OutboxMessage if tenant_id is not None else PlatformOutboxMessage

    messages, runs, run_ids = [], [], []
    for spec in specs:
        run_id = uuid.uuid4()
        envelope = {
            "version": ENVELOPE_VERSION,
            "run_id": str(run_id),
            "task": spec.name,
            "queue": spec.queue,
            "destination": _destination(spec, payload),
            "event": event,
            "event_id": event_id,
            "tenant": tenant_id,
            "payload": payload,
            "occurred_at": occurred_at,
            "correlation_id": correlation_id,
        }
        size = len(json.dumps(envelope, separators=(",", ":")).encode())
        if size > settings.OUTBOX_MAX_ENVELOPE_BYTES:
            raise EnvelopeTooLarge(
                f"envelope of {spec.name} is {size} bytes; "
                f"the limit is {settings.OUTBOX_MAX_ENVELOPE_BYTES}"
            )
        row = model(run_id=run_id, queue=spec.queue, envelope=envelope, available_at=available_at)
        if tenant_id is not None:
            row.tenant_id = tenant_id
        messages.append(row)
        run_ids.append(run_id)
        if spec.destination == "automation":
            continue  # settled by nobody: see the module's docstring
        runs.append(
            TaskRun(
                run_id=run_id,
                task=spec.name,
                queue=spec.queue,
                event=event or "",
                tenant_id=tenant_id,
                status=TaskRun.Status.QUEUED,
                correlation_id=correlation_id,
            )
        )
    TaskRun.objects.bulk_create(runs)
    model.objects.bulk_create(messages)
    signal_relay_on_commit()
    return run_ids


def _destination(spec: TaskSpec, payload: Mapping[str, Any]) -> str:
    if spec.destination == "automation":
        automation_id = payload.get("automation_id")
        if not isinstance(automation_id, int) or isinstance(automation_id, bool):
            raise InvalidPayload(
                f"task {spec.name} goes to an automation's queue: "
                "its payload needs an integer 'automation_id'"
            )
        return automation_queue_name(automation_id)
    return spec.queue


def _available_at(delay: timedelta | float | None) -> models.Expression:
    # Due times come from the database clock, the same clock the relay compares with.
    now = clock_timestamp()
    if delay is None:
        return now
    if not isinstance(delay, timedelta):
        if isinstance(delay, bool) or not isinstance(delay, int | float):
            raise OutboxError(f"delay must be a timedelta or seconds, not {delay!r}")
        delay = timedelta(seconds=delay)
    if delay < timedelta(0):
        raise OutboxError("delay cannot be negative")
    return now + models.Value(delay, output_field=models.DurationField())


def _require_transaction() -> None:
    if not transaction.get_connection().in_atomic_block:
        raise NotInTransaction(
            "the outbox must be written inside the caller's transaction (transaction.atomic)"
        )


def _json_object(payload: Any) -> str:
    if not isinstance(payload, Mapping):
        raise InvalidPayload(f"payload must be a JSON object, not {type(payload).__name__}")
    try:
        return json.dumps(dict(payload), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(f"payload is not JSON: {exc}") from None


def _aggregate_key(aggregate: Any) -> tuple[str, str]:
    if isinstance(aggregate, tuple) and len(aggregate) == 2:
        return str(aggregate[0]), str(aggregate[1])
    meta = getattr(aggregate, "_meta", None)
    if meta is not None and aggregate.pk is not None:
        return meta.object_name, str(aggregate.pk)
    raise TypeError(f"aggregate must be a saved model instance or a (type, id) pair: {aggregate!r}")


def _id_of(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    pk = getattr(value, "pk", None)
    if pk is None:
        raise TypeError(f"expected a saved model instance or an id, got {value!r}")
    return pk
