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
"""

from __future__ import annotations

from collections.abc import Callable
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

_listeners: dict[str, EventListener] = {}
_batch_listeners: dict[str, BatchListener] = {}


def register_event_listener(
    name: str, listener: EventListener, *, batch: BatchListener | None = None
) -> None:
    """Call ``listener`` for every event published from now on (``name`` keeps it unique);
    ``batch``, when given, for the events of one ``publish_many`` together instead."""
    _listeners[name] = listener
    if batch is None:
        _batch_listeners.pop(name, None)
    else:
        _batch_listeners[name] = batch


def notify_listeners(event: RecordedEvent) -> None:
    for listener in _listeners.values():
        listener(event)


def notify_listeners_of_many(events: list[RecordedEvent]) -> None:
    for name, listener in _listeners.items():
        batch = _batch_listeners.get(name)
        if batch is not None:
            batch(events)
        else:
            for event in events:
                listener(event)
