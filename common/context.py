"""The correlation id of the work in progress (a request or a task run).

Set by ``CorrelationIdMiddleware`` for requests and by the worker runtime
for tasks, so that every message a piece of work causes carries the id of
what started it.
"""

from __future__ import annotations

import uuid
from contextvars import ContextVar

_correlation_id: ContextVar[str | None] = ContextVar("correlation_id", default=None)


def get_correlation_id() -> str:
    """The current correlation id, or a new one when nothing set it."""
    current = _correlation_id.get()
    if current is None:
        current = str(uuid.uuid4())
        _correlation_id.set(current)
    return current


def set_correlation_id(value: str | None):
    """Set the id; returns a token for ``reset_correlation_id``."""
    return _correlation_id.set(value)


def reset_correlation_id(token) -> None:
    _correlation_id.reset(token)
