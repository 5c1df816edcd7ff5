"""The outbox write path: ``dispatch`` and ``publish``, and their bulk forms
``dispatch_many`` and ``publish_many``.

All run inside the caller's transaction and write everything the change
causes: the outbox row(s), their ``task_runs`` rows (``queued``) and, for an
event, its row in the ``events`` trail. A message addressed to an automation's own
worker gets no ``task_runs`` row: that worker has no database and never settles a
run, which would stay ``queued`` forever. If the caller's transaction rolls
back, none of it exists; if it commits, all of it does. Only the Redis wake
signal waits for the commit (``transaction.on_commit``).

Envelope (the JSON the broker carries; version 1)::

    {"version": 1, "run_id": "…", "task": "machines.power_on", "queue": "critical",
     "destination": "critical", "event": "JobCreated" | null, "event_id": 17 | null,
     "tenant": 3 | null, "payload": {…}, "occurred_at": "…", "correlation_id": "…",
     "traceparent": "00-…-…-01"}

``traceparent`` (W3C Trace Context) names the span that dispatched the run, so that the
relay's publish, the task's run and what it causes join the trace of the request that
committed the change; it is there only while tracing is on (``common.tracing``).

``destination`` is the queue the message belongs to, without the environment's
prefix: the queue class, or ``automation-<id>`` for an automation's own worker.

``publish_new`` writes a new row of the caller's (a job) in the same statement as the event
about it, the payload taking the row's id from the row's own INSERT.

The bulk forms write what as many calls of ``dispatch`` or ``publish`` would (one row per
subscriber of each event, the delay as ``available_at``, one wake after the commit) in a
few statements for all of them, not a few for each: a batch of due schedules, an event
fanned out to many.
"""

from __future__ import annotations

import functools
import json
import re
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, connections, models, transaction
from django.db.models.expressions import DatabaseDefault, RawSQL
from django.db.models.sql import InsertQuery
from django.utils import timezone

from broker.topology import automation_queue_name
from common import tracing
from common.columns import JSONArray, insert_sql
from common.context import get_correlation_id
from outbox.catalog import TaskSpec, get_catalog
from outbox.listeners import (
    Condition,
    RecordedEvent,
    listener_conditions,
    notify_listeners,
    notify_listeners_of_many,
)
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
    with tracing.maybe_span(f"outbox.dispatch {task}", attributes={"hubdommed.task": task}):
        runs = _prepare_runs([spec], body, tenant_id=_id_of(tenant), event=None, delay=delay)
        (run_id,) = runs.write()
    return run_id


def dispatch_many(
    task: str,
    payloads: Iterable[Mapping[str, Any]],
    *,
    tenant: Any = None,
    delay: timedelta | float | None = None,
) -> list[uuid.UUID]:
    """Record one run of ``task`` per payload, as that many ``dispatch`` calls would, in
    one statement. Returns their run_ids, in the payloads' order; a payload refused (not
    JSON, an envelope too large) refuses them all before anything is written."""
    _require_transaction()
    spec = get_catalog().task(task)
    bodies = [_json_object(payload) for payload in payloads]
    tenant_id = _id_of(tenant)
    with tracing.maybe_span(
        f"outbox.dispatch_many {task}",
        attributes={"hubdommed.task": task, "hubdommed.runs": len(bodies)},
    ):
        runs = _Runs.joined(
            [
                _prepare_runs([spec], body, tenant_id=tenant_id, event=None, delay=delay)
                for body in bodies
            ]
        )
        return runs.write()


@dataclass(frozen=True)
class Occurrence:
    """One event for ``publish_many``: the arguments of one ``publish``."""

    event: str
    payload: Mapping[str, Any]
    aggregate: Any
    tenant: Any = None
    actor: Any = None
    # The trace its rows continue (a W3C traceparent), when it is not the current span's:
    # the events of a batch that are each of a trace of their own.
    traceparent: str | None = None


# Events ``publish_many`` writes in one statement. Its rows go as columns, so its parameters
# do not grow with them (a few dozen, whatever the number of events and subscribers): the
# chunk bounds the statement's size and the memory it takes, as one batch of due schedules.
PUBLISH_MANY_CHUNK = 500


def publish_many(occurrences: Iterable[Occurrence]) -> list[Published]:
    """Record many events, as that many ``publish`` calls would (each its trail row and one
    run per subscriber, the listeners told of each), in two statements per
    ``PUBLISH_MANY_CHUNK`` events. Returns one ``Published`` per occurrence, in order.

    Every refusal (a payload missing its routing key, an envelope too large) is found
    before anything is written, and refuses them all; a listener that fails undoes them all.
    """
    _require_transaction()
    occurrences = list(occurrences)
    published: list[Published] = []
    with tracing.maybe_span(
        "outbox.publish_many", attributes={"hubdommed.events": len(occurrences)}
    ):
        for start in range(0, len(occurrences), PUBLISH_MANY_CHUNK):
            published.extend(_publish_chunk(occurrences[start : start + PUBLISH_MANY_CHUNK]))
    return published


def _publish_chunk(occurrences: list[Occurrence]) -> list[Published]:
    """Many events in one statement, their rows built as columns (``common.columns``): a
    tuple a row, not a model instance, and no value converted one by one."""
    if not occurrences:
        return []
    catalog = get_catalog()
    correlation_id = get_correlation_id()
    traceparent = tracing.current_traceparent()
    occurred_at = timezone.now().isoformat()
    # Every refusal (a payload that is not JSON, one missing its routing key, an envelope
    # too large) is found before anything is written.
    prepared = []
    for occurrence in occurrences:
        body = _json_object(occurrence.payload)
        payload = json.loads(body)
        specs = catalog.subscribers(occurrence.event)
        prepared.append(
            _Prepared(
                occurrence.event,
                body,
                payload,
                [(spec, _destination(spec, payload)) for spec in specs],
                *_aggregate_key(occurrence.aggregate),
                _id_of(occurrence.tenant),
                actor_label(occurrence.actor),
                occurrence.traceparent or traceparent,
            )
        )
    # The events' ids first (one statement): each envelope then carries its own, and is
    # checked for size with it.
    event_ids = _new_event_ids(len(prepared))
    messages: dict[type[models.Model], list[tuple[uuid.UUID, str, str, int | None]]] = {}
    runs: list[tuple[uuid.UUID, str, str, str, int | None]] = []
    run_ids: list[list[uuid.UUID]] = []
    for event, event_id in zip(prepared, event_ids, strict=True):
        model = OutboxMessage if event.tenant_id is not None else PlatformOutboxMessage
        ids = []
        for spec, destination in event.specs:
            run_id = uuid.uuid4()
            envelope = _envelope(
                spec,
                run_id=run_id,
                destination=destination,
                event=event.type,
                event_id=event_id,
                tenant_id=event.tenant_id,
                payload=event.payload,
                occurred_at=occurred_at,
                correlation_id=correlation_id,
                traceparent=event.traceparent,
            )
            text = json.dumps(envelope, separators=(",", ":"))
            _check_size(spec.name, len(text.encode()))
            messages.setdefault(model, []).append((run_id, spec.queue, text, event.tenant_id))
            if spec.destination != "automation":  # settled by nobody: see the docstring
                runs.append((run_id, spec.name, spec.queue, event.type, event.tenant_id))
            ids.append(run_id)
        run_ids.append(ids)
    occurred = _write_columns(prepared, event_ids, runs, messages, correlation_id)
    recorded = [
        RecordedEvent(
            id=event_id,
            type=event.type,
            tenant_id=event.tenant_id,
            aggregate_type=event.aggregate_type,
            aggregate_id=event.aggregate_id,
            payload=event.payload,
            occurred_at=occurred[event_id],
        )
        for event, event_id in zip(prepared, event_ids, strict=True)
    ]
    try:
        notify_listeners_of_many(recorded)
    except Exception:
        if not connection.needs_rollback:
            Event.objects.filter(pk__in=event_ids).delete()
            every_run = [run_id for ids in run_ids for run_id in ids]
            for model in (OutboxMessage, PlatformOutboxMessage):
                model.objects.filter(run_id__in=every_run).delete()
            TaskRun.objects.filter(run_id__in=every_run).delete()
        raise
    return [
        Published(event_id=event_id, run_ids=tuple(ids))
        for event_id, ids in zip(event_ids, run_ids, strict=True)
    ]


@dataclass(frozen=True)
class _Prepared:
    """One event of ``publish_many``, checked and ready to write."""

    type: str
    body: str
    payload: dict[str, Any]
    specs: list[tuple[TaskSpec, str]]  # each subscriber and its destination
    aggregate_type: str
    aggregate_id: str
    tenant_id: int | None
    actor: str
    traceparent: str | None


_NEW_EVENTS = 'SELECT "id", "occurred_at" FROM new_events'


def _new_event_ids(count: int) -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)",
            [Event._meta.db_table, count],
        )
        return [event_id for (event_id,) in cursor.fetchall()]


def _write_columns(
    events: list[_Prepared],
    event_ids: list[int],
    runs: list[tuple[uuid.UUID, str, str, str, int | None]],
    messages: dict[type[models.Model], list[tuple[uuid.UUID, str, str, int | None]]],
    correlation_id: str,
) -> dict[int, datetime]:
    """Write the events (their ids already taken), their runs and outbox rows in one
    statement; returns each event's ``occurred_at``, the database's."""
    parts, params = [], []
    # The ids were taken from the column's own sequence: an identity column takes them so.
    sql, values = insert_sql(
        Event,
        {
            "id": event_ids,
            "type": [event.type for event in events],
            "aggregate_type": [event.aggregate_type for event in events],
            "aggregate_id": [event.aggregate_id for event in events],
            "tenant_id": [event.tenant_id for event in events],
            "actor": [event.actor for event in events],
            "payload": JSONArray.of_texts([event.body for event in events]),
        },
        same={"correlation_id": correlation_id},
        overriding=True,
    )
    parts.append(f'new_events AS ({sql} RETURNING "id", "occurred_at")')
    params.extend(values)
    if runs:
        run_id, task, queue, event, tenant_id = zip(*runs, strict=True)
        sql, values = insert_sql(
            TaskRun,
            {
                "run_id": run_id,
                "task": task,
                "queue": queue,
                "event": event,
                "tenant_id": tenant_id,
            },
            same={"status": TaskRun.Status.QUEUED, "correlation_id": correlation_id},
        )
        parts.append(f"new_runs AS ({sql})")
        params.extend(values)
    for n, (model, rows) in enumerate(messages.items()):
        run_id, queue, envelope, tenant_id = zip(*rows, strict=True)
        columns = {"run_id": run_id, "queue": queue, "envelope": JSONArray.of_texts(envelope)}
        if model is OutboxMessage:
            columns["tenant_id"] = tenant_id
        # Due times come from the database clock, the same clock the relay compares with.
        sql, values = insert_sql(model, columns, same={"available_at": clock_timestamp()})
        parts.append(f"new_messages_{n} AS ({sql})")
        params.extend(values)
    with connection.cursor() as cursor:
        # Only the models' own INSERTs are joined here; every value is a parameter.
        cursor.execute(f"WITH {', '.join(parts)} {_NEW_EVENTS}", params)
        occurred = dict(cursor.fetchall())
    if messages:
        signal_relay_on_commit()
    return occurred


def publish_new(
    event: str,
    payload: Mapping[str, Any],
    *,
    row: models.Model,
    id_key: str,
    tenant: Any = None,
    actor: Any = None,
) -> Published:
    """Write ``row``, a new instance whose id its table draws, and record ``event`` about
    it: what ``row.save()`` and then ``publish(event, payload, aggregate=row)`` would write,
    ``payload[id_key]`` and the event's aggregate id being the new row's id. ``row`` gets
    its id (fields it leaves to a database default are not read back).

    One statement, not two: the row's INSERT is the first of the chained INSERTs, and the
    event, its runs and its outbox rows take its id from there. A refusal of the row (one
    of its constraints) writes none of them.
    """
    _require_transaction()
    if not _PAYLOAD_KEY.fullmatch(id_key):
        raise OutboxError(f"id_key must be a plain key, not {id_key!r}")
    with tracing.maybe_span(f"outbox.publish {event}", attributes={"hubdommed.event": event}):
        return _publish(
            event, payload, tenant=tenant, aggregate=row, actor=actor, new_row=_NewRow(row, id_key)
        )


# A payload's key that publish_new fills with the new row's id.
_PAYLOAD_KEY = re.compile(r"[a-z_][a-z0-9_]*")


@dataclass(frozen=True)
class _NewRow:
    """The row publish_new writes before its event, and the payload's key for its id."""

    instance: models.Model
    id_key: str


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
    with tracing.maybe_span(f"outbox.publish {event}", attributes={"hubdommed.event": event}):
        return _publish(event, payload, tenant=tenant, aggregate=aggregate, actor=actor)


def _publish(
    event: str,
    payload: Mapping[str, Any],
    *,
    tenant: Any,
    aggregate: Any,
    actor: Any,
    new_row: _NewRow | None = None,
) -> Published:
    subscribers = get_catalog().subscribers(event)
    if new_row is None:
        body = _json_object(payload)
        aggregate_type, aggregate_id = _aggregate_key(aggregate)
    else:
        # 0 until the row's INSERT gives its id: the shortest an id can be, so that the
        # size checked before the write is the smallest the envelope can have.
        body = _json_object({**payload, new_row.id_key: 0})
        aggregate_type, aggregate_id = aggregate._meta.object_name, ""
    tenant_id = _id_of(tenant)
    # Every refusal (a payload missing its routing key, an envelope too large) is found
    # before anything is written, so that none leaves a trail row behind; no savepoint
    # (two round trips on every event) is needed for that.
    runs = _prepare_runs(subscribers, body, tenant_id=tenant_id, event=event, delay=None)
    record = Event(
        type=event,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        tenant_id=tenant_id,
        actor=actor_label(actor),
        payload=json.loads(body),
        correlation_id=get_correlation_id(),
    )
    # Whether each listener has work for the event is asked by the event's own statement.
    conditions = listener_conditions(event, tenant_id)
    asked = {name: condition for name, condition in conditions.items() if condition is not None}
    event_id, held = runs.write_with_event(record, new_row=new_row, conditions=asked)
    # Apps that keep rows of their own for each event (webhook deliveries) write them now,
    # in the caller's transaction. A listener that fails fails the publish, which leaves
    # nothing behind, as any refusal of ``publish`` (each listener writes its rows in one
    # statement, so it leaves none either).
    try:
        notify_listeners(
            RecordedEvent(
                id=event_id,
                type=event,
                tenant_id=tenant_id,
                aggregate_type=aggregate_type,
                aggregate_id=record.aggregate_id,
                payload=record.payload,
                occurred_at=record.occurred_at,
            ),
            holding=held,
        )
    except Exception:
        if not connection.needs_rollback:
            runs.undo(event_id, new_row=new_row)
        raise
    return Published(event_id=event_id, run_ids=tuple(runs.run_ids))


def actor_label(actor: Any) -> str:
    if actor is None:
        return "system"
    if isinstance(actor, str):
        return actor
    model = getattr(actor, "_meta", None)
    if model is not None and getattr(actor, "pk", None) is not None:
        return f"{model.model_name}:{actor.pk}"
    raise TypeError(f"cannot name actor {actor!r}")


# The envelope's ``"event_id":null`` is 4 characters; an id takes its digits instead.
_NULL_ID_LENGTH = len("null")


@dataclass
class _Runs:
    """The rows of one dispatch or publish, built and checked before any is written."""

    model: type[OutboxMessage] | type[PlatformOutboxMessage]
    messages: list[OutboxMessage | PlatformOutboxMessage]
    runs: list[TaskRun]
    # Bytes of each message's envelope as compact JSON with ``event_id`` null.
    sizes: list[int]

    @property
    def run_ids(self) -> list[uuid.UUID]:
        return [message.run_id for message in self.messages]

    @classmethod
    def joined(cls, parts: list[_Runs]) -> _Runs:
        """The rows of several dispatches of one tenant (or none), written as one."""
        model = parts[0].model if parts else PlatformOutboxMessage
        return cls(
            model,
            [message for part in parts for message in part.messages],
            [run for part in parts for run in part.runs],
            [size for part in parts for size in part.sizes],
        )

    def write(self) -> list[uuid.UUID]:
        """Write the outbox rows and their runs, in one statement."""
        if self.messages:
            self._execute(with_event=None)
        return self.run_ids

    def write_with_event(
        self,
        event: Event,
        *,
        new_row: _NewRow | None = None,
        conditions: Mapping[str, Condition] | None = None,
    ) -> tuple[int, dict[str, bool]]:
        """Write the event's trail row, the outbox rows and their runs, in one statement
        (the envelopes take the new row's id there); and first ``new_row``, whose id the
        event's payload and aggregate id take. ``conditions`` are evaluated by the same
        statement. Returns the event's id and whether each condition held; ``event`` gets
        its id and the database's ``occurred_at``."""
        event_id, event.occurred_at, row_id, held = self._execute(
            with_event=event, new_row=new_row, conditions=conditions or {}
        )
        event.pk = event_id
        # The id's digits in place of the null (event_id) and the 0 (the row's) measured.
        grown = len(str(event_id)) - _NULL_ID_LENGTH
        if new_row is not None:
            row = new_row.instance
            row.pk, row._state.adding, row._state.db = row_id, False, connection.alias
            event.aggregate_id = str(row_id)
            event.payload[new_row.id_key] = row_id
            grown += len(str(row_id)) - 1
        for message, size in zip(self.messages, self.sizes, strict=True):
            message.envelope["event_id"] = event_id
            if new_row is not None:
                message.envelope["payload"][new_row.id_key] = row_id
            try:
                _check_size(message.envelope["task"], size + grown)
            except EnvelopeTooLarge:
                # Only an envelope within a few bytes of the limit gets here: the ids,
                # known only now, made it longer than the check before could tell.
                self.undo(event_id, new_row=new_row)
                raise
        return event_id, held

    def undo(self, event_id: int | None, *, new_row: _NewRow | None = None) -> None:
        """Delete what ``write_with_event`` wrote, for a publish refused after it."""
        Event.objects.filter(pk=event_id).delete()
        self.model.objects.filter(run_id__in=self.run_ids).delete()
        TaskRun.objects.filter(run_id__in=self.run_ids).delete()
        if new_row is not None:
            row = new_row.instance
            # The row as written, without the cascade a model's delete() collects: nothing
            # can point at a row this transaction has just written and not shown to anyone.
            with connection.cursor() as cursor:
                cursor.execute(
                    f"DELETE FROM {connection.ops.quote_name(row._meta.db_table)} "  # noqa: S608 (the model's own table; the id a parameter)
                    f"WHERE {connection.ops.quote_name(row._meta.pk.column)} = %s",
                    [row.pk],
                )
            row.pk, row._state.adding = None, True

    def _execute(
        self,
        *,
        with_event: Event | None,
        new_row: _NewRow | None = None,
        conditions: Mapping[str, Condition] | None = None,
    ) -> tuple[int | None, datetime | None, int | None, dict[str, bool]]:
        """One statement for every row: a round trip, not one per table.

        The INSERTs write what ``bulk_create`` would, and are chained as data-modifying
        CTEs; the envelopes read the event's id from its CTE, and the event and the
        envelopes the new row's id from the row's. The listeners' ``conditions`` are
        columns of its answer.
        """
        parts, params = [], []
        row_key = None
        if new_row is not None:
            row, row_key = new_row.instance, new_row.id_key
            sql, values = _rows_sql(type(row), [row])
            pk = connection.ops.quote_name(row._meta.pk.column)
            parts.append(f'new_row AS ({sql} RETURNING {pk} AS "id")')
            params.extend(values)
        envelope = None
        if with_event is not None:
            event_values = None
            if row_key is not None:
                event_values = {
                    "aggregate_id": lambda _: _ROW_ID_AS_TEXT,
                    "payload": lambda event: _WithRowId(event.payload, row_key),
                }
            sql, values = _rows_sql(Event, [with_event], replace=event_values)
            parts.append(f'new_event AS ({sql} RETURNING "id", "occurred_at")')
            params.extend(values)
            envelope = {"envelope": lambda message: _WithEventId(message.envelope, row_key=row_key)}
        if self.runs:
            sql, values = _rows_sql(TaskRun, self.runs)
            parts.append(f"new_runs AS ({sql})")
            params.extend(values)
        if self.messages:
            sql, values = _rows_sql(self.model, self.messages, replace=envelope)
            parts.append(f"new_messages AS ({sql})")
            params.extend(values)
        result = (
            "(SELECT id FROM new_event), (SELECT occurred_at FROM new_event)"
            if with_event is not None
            else "NULL, NULL"
        )
        result += ", (SELECT id FROM new_row)" if new_row is not None else ", NULL"
        names = list(conditions or {})
        for name in names:
            condition = conditions[name]
            result += f", COALESCE(({condition.sql}), false)"
            params.extend(condition.params)
        with connection.cursor() as cursor:
            cursor.execute(f"WITH {', '.join(parts)} SELECT {result}", params)
            event_id, occurred_at, row_id, *answers = cursor.fetchone()
        if self.messages:
            signal_relay_on_commit()
        return event_id, occurred_at, row_id, dict(zip(names, answers, strict=True))


# The output field of the expressions below: one for all, as a Value's would be.
_JSON = models.JSONField()


class _WithEventId(RawSQL):
    """An envelope whose ``event_id`` is the id of the event written in the same
    statement (the ``new_event`` CTE), and whose payload's ``row_key``, when given, the id
    of the row written there (the ``new_row`` CTE)."""

    def __init__(self, envelope: dict[str, Any], *, row_key: str | None = None) -> None:
        body = json.dumps(envelope, separators=(",", ":"))
        if row_key is None:
            sql, params = _ENVELOPE_WITH_EVENT_ID, (body,)
        else:
            sql, params = _ENVELOPE_WITH_EVENT_AND_ROW_IDS, (body, f"{{payload,{row_key}}}")
        super().__init__(sql, params, output_field=_JSON)


class _WithRowId(RawSQL):
    """An event's payload whose ``key`` is the id of the row written in the same statement
    (the ``new_row`` CTE)."""

    def __init__(self, payload: dict[str, Any], key: str) -> None:
        super().__init__(
            "jsonb_set(%s::jsonb, %s::text[], to_jsonb((SELECT id FROM new_row)))",
            (json.dumps(payload, separators=(",", ":")), f"{{{key}}}"),
            output_field=_JSON,
        )


_ROW_ID_AS_TEXT = RawSQL('SELECT "id"::text FROM new_row', ())

# The expressions _values_sql writes as RawSQL compiles them: they name no column of a
# query, so there is nothing to resolve.
_RAW = frozenset({RawSQL, _WithEventId, _WithRowId})

_ENVELOPE_WITH_EVENT_ID = "jsonb_set(%s::jsonb, '{event_id}', to_jsonb((SELECT id FROM new_event)))"
# The payload's key is a parameter: a text[] path, '{payload,<key>}'.
_ENVELOPE_WITH_EVENT_AND_ROW_IDS = (
    "jsonb_set(jsonb_set(%s::jsonb, '{event_id}', to_jsonb((SELECT id FROM new_event))), "
    "%s::text[], to_jsonb((SELECT id FROM new_row)))"
)


# Rows of a model that one INSERT … VALUES carries; more go as arrays (``_insert_sql``).
_FEW_ROWS = 16


def _rows_sql(
    model: type[models.Model],
    objs: list[models.Model],
    *,
    replace: Mapping[str, Callable[[Any], Any]] | None = None,
) -> tuple[str, list[Any]]:
    """The INSERT of ``objs``: ``_values_sql`` for a few rows, ``_insert_sql`` for many."""
    if replace is None and len(objs) > _FEW_ROWS:
        return _insert_sql(model, objs)
    return _values_sql(model, objs, replace=replace)


def _values_sql(
    model: type[models.Model],
    objs: list[models.Model],
    *,
    replace: Mapping[str, Callable[[Any], Any]] | None = None,
) -> tuple[str, list[Any]]:
    """``INSERT … VALUES (…), …`` of ``objs``, the values ``bulk_create`` would send (each
    field's ``pre_save`` and ``get_db_prep_save``), built without the compiler (most of
    a publish's time went into compiling its few rows): a value is a parameter, None the
    literal NULL, an expression its own SQL, a database default DEFAULT, and a column every
    row leaves to its default is left out. ``replace`` gives, by field name, the value to
    write instead of the row's own (an expression reading another CTE).
    """
    db = connections[connection.alias]
    fields, columns, attnames = _insertable(model)
    rows = []
    for obj in objs:
        # A field's pre_save is its value unless it says otherwise (auto_now...).
        values = [
            getattr(obj, attname) if attname else field.pre_save(obj, add=True)
            for field, attname in zip(fields, attnames, strict=True)
        ]
        if replace:
            for n, field in enumerate(fields):
                if field.name in replace:
                    values[n] = replace[field.name](obj)
        rows.append(values)
    defaults = [isinstance(value, DatabaseDefault) for value in rows[0]]
    for row in rows[1:]:
        defaults = [
            default and isinstance(value, DatabaseDefault)
            for default, value in zip(defaults, row, strict=True)
        ]
    kept = [n for n, default in enumerate(defaults) if not default]
    compiler = None
    params: list[Any] = []
    tuples = []
    for row in rows:
        sqls = []
        for n in kept:
            value = row[n]
            if value is None:
                sqls.append("NULL")
            elif isinstance(value, DatabaseDefault):
                sqls.append("DEFAULT")
            elif type(value) in _RAW:
                # What RawSQL compiles to, without resolving a copy of it first.
                sqls.append(f"({value.sql})")
                params.extend(value.params)
            elif hasattr(value, "resolve_expression"):
                if compiler is None:
                    compiler = InsertQuery(model).get_compiler(connection=db)
                sql, values = _compiled(compiler, value)
                sqls.append(sql)
                params.extend(values)
            else:
                prepared = fields[n].get_db_prep_save(value, db)
                sqls.append("NULL" if prepared is None else "%s")
                if prepared is not None:
                    params.append(prepared)
        tuples.append(f"({', '.join(sqls)})")
    names = ", ".join(columns[n] for n in kept)
    table = db.ops.quote_name(model._meta.db_table)
    return f"INSERT INTO {table} ({names}) VALUES {', '.join(tuples)}", params  # noqa: S608 (names and expressions of the model, every value a parameter)


@functools.cache
def _insertable(
    model: type[models.Model],
) -> tuple[list[models.Field], list[str], list[str | None]]:
    """The fields an INSERT of ``model`` writes (not its own id, nor generated ones), their
    quoted columns, and for each whose ``pre_save`` gives the attribute as it is, its
    attribute's name."""
    meta = model._meta
    fields = [
        field
        for field in meta.concrete_fields
        if not field.generated and field is not meta.auto_field
    ]
    plain = [field.attname if _plain_pre_save(field) else None for field in fields]
    return fields, [connection.ops.quote_name(field.column) for field in fields], plain


def _plain_pre_save(field: models.Field) -> bool:
    """Whether the field's ``pre_save`` gives its attribute as it is."""
    pre_save = type(field).pre_save
    if pre_save is models.Field.pre_save:
        return True
    # A date's sets the time of the save, but only with auto_now or auto_now_add.
    return (
        pre_save in (models.DateField.pre_save, models.DateTimeField.pre_save)
        and not field.auto_now
        and not field.auto_now_add
    )


def _insert_sql(
    model: type[models.Model],
    objs: list[models.Model],
    *,
    with_pk: bool = False,
    overriding: bool = False,
) -> tuple[str, list[Any]]:
    """The INSERT of ``objs`` as SQL and parameters (``with_pk``: their ids, taken before,
    are written too; ``overriding``: into an identity column).

    Many rows go as one array per column, ``INSERT … SELECT … FROM unnest(…)``: a parameter
    per column instead of one per value, which the compiler and the driver would otherwise
    build and parse value by value (most of a large batch's time). The values are the ones
    ``bulk_create`` would send (each field's ``pre_save`` and ``get_db_prep_save``); a
    column every row leaves to its database default is left out, and one whose every row
    has the same SQL expression (``clock_timestamp()``) is that expression in the SELECT.
    Otherwise (expressions that differ, defaults for some rows only, an array column, one
    row) it is the compiler's own INSERT.
    """
    meta = model._meta
    fields = [
        field
        for field in meta.concrete_fields
        if not field.generated and (with_pk or field is not meta.auto_field)
    ]
    override = " OVERRIDING SYSTEM VALUE" if overriding else ""
    if len(objs) > 1:
        columns = _as_columns(model, fields, objs)
        if columns is not None and any(column.sql is None for column in columns):
            selected, casts, select_params, arrays = [], [], [], []
            for column in columns:
                if column.sql is not None:
                    selected.append(column.sql)
                    select_params.extend(column.params)
                else:
                    selected.append(f"u.c{len(arrays)}")
                    casts.append(f"%s::{column.field.db_type(connection)}[]")
                    arrays.append(column.params)
            names = ", ".join(connection.ops.quote_name(column.field.column) for column in columns)
            aliases = ", ".join(f"c{n}" for n in range(len(arrays)))
            table = connection.ops.quote_name(model._meta.db_table)
            sql = (
                f"INSERT INTO {table} ({names}){override} SELECT {', '.join(selected)} "  # noqa: S608 (names, types and expressions of the model, every value a parameter)
                f"FROM unnest({', '.join(casts)}) AS u({aliases})"
            )
            return sql, select_params + arrays
    query = InsertQuery(model)
    query.insert_values(fields, objs)
    ((sql, params),) = query.get_compiler(connection=connection).as_sql()
    if overriding:
        sql = sql.replace(") VALUES (", f"){override} VALUES (", 1)
    return sql, list(params)


@dataclass
class _Column:
    field: models.Field
    # The values, one a row; or, for a column whose every row has the same SQL expression
    # (``clock_timestamp()``), that SQL and its parameters.
    params: list[Any]
    sql: str | None = None


def _as_columns(
    model: type[models.Model], fields: list[models.Field], objs: list[models.Model]
) -> list[_Column] | None:
    """The columns of the INSERT of ``objs``, their values one list per column; None where
    arrays cannot carry them (an array column, some rows with the database default and
    some without, an expression that is not the same in every row)."""
    compiler = InsertQuery(model).get_compiler(connection=connection)
    columns = []
    for field in fields:
        if field.db_type(connection).endswith("]"):
            return None
        values = [field.pre_save(obj, add=True) for obj in objs]
        defaults = sum(isinstance(value, DatabaseDefault) for value in values)
        if defaults == len(values):
            continue
        expressions = sum(hasattr(value, "resolve_expression") for value in values)
        if defaults or expressions not in (0, len(values)):
            return None
        if expressions:
            compiled = {_compiled(compiler, value) for value in values}
            if len(compiled) != 1:
                return None
            ((sql, params),) = compiled
            columns.append(_Column(field, list(params), sql))
        else:
            columns.append(_Column(field, [field.get_db_prep_save(v, connection) for v in values]))
    return columns


def _compiled(compiler, value) -> tuple[str, tuple[Any, ...]]:
    resolved = value.resolve_expression(compiler.query, allow_joins=False, for_save=True)
    sql, params = compiler.compile(resolved)
    return sql, tuple(params)


def _prepare_runs(
    specs: Iterable[TaskSpec],
    body: str,
    *,
    tenant_id: int | None,
    event: str | None,
    delay: timedelta | float | None,
) -> _Runs:
    model = OutboxMessage if tenant_id is not None else PlatformOutboxMessage
    specs = list(specs)
    if not specs:
        return _Runs(model, [], [], [])
    payload = json.loads(body)
    correlation_id = get_correlation_id()
    traceparent = tracing.current_traceparent()
    occurred_at = timezone.now().isoformat()
    available_at = _available_at(delay)

    messages, runs, sizes = [], [], []
    for spec in specs:
        run_id = uuid.uuid4()
        envelope = _envelope(
            spec,
            run_id=run_id,
            destination=_destination(spec, payload),
            event=event,
            # An event's id is known once its trail row is written.
            event_id=None,
            tenant_id=tenant_id,
            payload=payload,
            occurred_at=occurred_at,
            correlation_id=correlation_id,
            traceparent=traceparent,
        )
        size = len(json.dumps(envelope, separators=(",", ":")).encode())
        # The shortest id an event can have: an envelope over the limit even with it is
        # refused before anything is written.
        _check_size(spec.name, size if event is None else size - _NULL_ID_LENGTH + 1)
        sizes.append(size)
        row = model(run_id=run_id, queue=spec.queue, envelope=envelope, available_at=available_at)
        if tenant_id is not None:
            row.tenant_id = tenant_id
        messages.append(row)
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
    return _Runs(model, messages, runs, sizes)


def _envelope(
    spec: TaskSpec,
    *,
    run_id: uuid.UUID,
    destination: str,
    event: str | None,
    event_id: int | None,
    tenant_id: int | None,
    payload: dict[str, Any],
    occurred_at: str,
    correlation_id: str,
    traceparent: str | None,
) -> dict[str, Any]:
    """The envelope of one run (the module's docstring shows it)."""
    envelope = {
        "version": ENVELOPE_VERSION,
        "run_id": str(run_id),
        "task": spec.name,
        "queue": spec.queue,
        "destination": destination,
        "event": event,
        "event_id": event_id,
        "tenant": tenant_id,
        "payload": payload,
        "occurred_at": occurred_at,
        "correlation_id": correlation_id,
    }
    if traceparent is not None:
        envelope["traceparent"] = traceparent
    return envelope


def _check_size(task: str, size: int) -> None:
    if size > settings.OUTBOX_MAX_ENVELOPE_BYTES:
        raise EnvelopeTooLarge(
            f"envelope of {task} is {size} bytes; the limit is {settings.OUTBOX_MAX_ENVELOPE_BYTES}"
        )


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
    if delay > timedelta(seconds=settings.OUTBOX_MAX_DELAY_SECONDS):
        # A row due later than this is taken by the monitor for a clock gone wrong.
        raise OutboxError(
            f"delay of {delay} is longer than OUTBOX_MAX_DELAY_SECONDS "
            f"({settings.OUTBOX_MAX_DELAY_SECONDS} s)"
        )
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
