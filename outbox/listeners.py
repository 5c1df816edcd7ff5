"""Who else hears of an event, inside the transaction that records it.

Some apps keep rows of their own for each event (a tenant's webhook deliveries) and must
write them atomically with the event, yet stand above the outbox: the outbox cannot import
them. So they register a listener here when Django starts them (``AppConfig.ready``), and
``publish`` calls every listener after writing the event's trail row and runs, in the
caller's transaction: a listener that raises fails the publish, which then deletes the event
and its runs, as any refusal of ``publish`` leaves nothing behind. A listener's writes must
leave nothing when it fails (one statement, or a savepoint of its own); it may ``dispatch``
tasks; it never does slow I/O.

``publish_many`` tells the listeners of many events at once: a listener registered with a
``batch`` form gets them all in one call (it may then read what it needs once for all of
them); one without is called once per event.

A listener with nothing to do for most events (a tenant without webhook endpoints) tells
``publish`` so with an ``interest``: for an event's type and tenant, an SQL condition that
``publish`` evaluates in the statement that writes the event (no round trip of its own),
the listener called only where it holds; or None, nothing to do whatever the rows say.
The condition reads the rows as that statement sees them, as a read of the listener's own
just before it would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any


@dataclass(frozen=True)
class RecordedEvent:
    """An event as ``publish`` recorded it (its row in the ``events`` trail)."""

    id: int
    type: str
    tenant_id: int | None
    aggregate_type: str
    aggregate_id: str
    payload: dict[str, Any]
    occurred_at: datetime


EventListener = Callable[[RecordedEvent], None]
BatchListener = Callable[[list[RecordedEvent]], None]


@dataclass(frozen=True)
class Condition:
    """An SQL boolean expression, with its parameters (``%s``), that ``publish`` evaluates
    in its own statement."""

    sql: str
    params: tuple[Any, ...] = ()


# For an event's type and tenant id: the condition under which the listener has work, or
# None when it has none.
Interest = Callable[[str, "int | None"], "Condition | None"]

_listeners: dict[str, EventListener] = {}
_batch_listeners: dict[str, BatchListener] = {}
_interests: dict[str, Interest] = {}


def register_event_listener(
    name: str,
    listener: EventListener,
    *,
    batch: BatchListener | None = None,
    interest: Interest | None = None,
) -> None:
    """Call ``listener`` for every event published from now on (``name`` keeps it unique);
    ``batch``, when given, for the events of one ``publish_many`` together instead;
    ``interest``, when given, says for which events ``publish`` calls ``listener`` at all
    (``publish_many`` leaves that to ``batch``)."""
    _listeners[name] = listener
    for registry, value in ((_batch_listeners, batch), (_interests, interest)):
        if value is None:
            registry.pop(name, None)
        else:
            registry[name] = value


def listener_conditions(event_type: str, tenant_id: int | None) -> dict[str, Condition | None]:
    """Each listener's condition for such an event, by name: None for one with nothing to
    do; a listener without an interest is not named (it is always called)."""
    return {name: interest(event_type, tenant_id) for name, interest in _interests.items()}


def notify_listeners(event: RecordedEvent, *, holding: Mapping[str, bool] | None = None) -> None:
    """Call the listeners of ``event``; with ``holding`` (the conditions of
    ``listener_conditions``, evaluated), of those with an interest only the ones whose
    condition held."""
    for name, listener in _listeners.items():
        if holding is None or name not in _interests or holding.get(name, False):
            listener(event)


def notify_listeners_of_many(events: list[RecordedEvent]) -> None:
    for name, listener in _listeners.items():
        batch = _batch_listeners.get(name)
        if batch is not None:
            batch(events)
        else:
            for event in events:
                listener(event)
