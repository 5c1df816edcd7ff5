"""Who else hears of an event, inside the transaction that records it.

Some apps keep rows of their own for each event (a tenant's webhook deliveries) and must
write them atomically with the event, yet stand above the outbox: the outbox cannot import
them. So they register a listener here when Django starts them (``AppConfig.ready``), and
``publish`` calls every listener after writing the event's trail row and runs, in the
caller's transaction: a listener that raises fails the publish, which then deletes the event
and its runs, as any refusal of ``publish`` leaves nothing behind. A listener's writes must
leave nothing when it fails (one statement, or a savepoint of its own); it may ``dispatch``
tasks; it never does slow I/O.
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

_listeners: dict[str, EventListener] = {}


def register_event_listener(name: str, listener: EventListener) -> None:
    """Call ``listener`` for every event published from now on (``name`` keeps it unique)."""
    _listeners[name] = listener


def notify_listeners(event: RecordedEvent) -> None:
    for listener in _listeners.values():
        listener(event)
