"""Task handlers, registered by the name they have in ``tasks.json``.

A handler is a plain function taking one ``TaskMessage``::

    from outbox.handlers import TaskMessage, task

    @task("maintenance.purge")
    def purge(message: TaskMessage) -> None: ...

Handlers live in each app's ``tasks.py`` and import only this module and
``outbox.task_errors``, never the worker. Only the worker imports those modules
(``worker.registry.discover_handlers``); the API finds a task's queue and subscribers in the catalog
and never imports a handler.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured


@dataclass(frozen=True)
class TaskMessage:
    """What a handler receives: the envelope's parts, and which receive this is."""

    run_id: uuid.UUID
    task: str
    payload: dict[str, Any]
    tenant: int | None
    receive_count: int
    event: str | None = None
    event_id: int | None = None
    correlation_id: str = ""
    envelope: dict[str, Any] = field(default_factory=dict, repr=False)


Handler = Callable[[TaskMessage], Any]

_handlers: dict[str, Handler] = {}


def task(name: str) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of task ``name``."""

    def register(handler: Handler) -> Handler:
        existing = _handlers.get(name)
        if existing is not None and _qualified(existing) != _qualified(handler):
            raise ImproperlyConfigured(
                f"task {name!r} has two handlers: {_qualified(existing)} and {_qualified(handler)}"
            )
        _handlers[name] = handler
        return handler

    return register


def _qualified(handler: Handler) -> str:
    return f"{handler.__module__}.{handler.__qualname__}"


def get_handler(name: str) -> Handler | None:
    return _handlers.get(name)


def registered() -> dict[str, Handler]:
    return dict(_handlers)
