"""The ids of the work in progress (a request, a relayed row or a task run).

The correlation id is set by ``CorrelationIdMiddleware`` for requests and by the worker
runtime for tasks, so that every message a piece of work causes carries the id of what
started it. ``log_context`` binds it and the other ids (``run_id``, ``job_id``,
``tenant_id``) for the duration of a block; ``common.logs.ContextFilter`` copies them onto
every log record written meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

_correlation_id: ContextVar[str | None] = ContextVar("correlation_id", default=None)
_log_ids: ContextVar[dict[str, str]] = ContextVar("log_ids", default={})  # noqa: B039 (never mutated)

# The ids a log line may carry besides the correlation id, in the order they are printed.
LOG_IDS = ("run_id", "job_id", "tenant_id")


def get_correlation_id() -> str:
    """The current correlation id, or a new one when nothing set it."""
    current = _correlation_id.get()
    if current is None:
        current = str(uuid.uuid4())
        _correlation_id.set(current)
    return current


def current_correlation_id() -> str | None:
    """The current correlation id, without making one up."""
    return _correlation_id.get()


def set_correlation_id(value: str | None):
    """Set the id; returns a token for ``reset_correlation_id``."""
    return _correlation_id.set(value)


def reset_correlation_id(token) -> None:
    _correlation_id.reset(token)


def current_log_ids() -> dict[str, str]:
    """The ids bound by the enclosing ``log_context`` blocks (never mutate the result)."""
    return _log_ids.get()


@contextmanager
def log_context(*, correlation_id: str | None = None, **ids: object) -> Iterator[None]:
    """Bind ids (``run_id``, ``job_id``, ``tenant_id``) to the log lines written in the block.

    ``None`` values are left out (an id not known yet); inner blocks add to outer ones. A
    ``correlation_id`` given here also becomes the one new messages carry.
    """
    unknown = set(ids) - set(LOG_IDS)
    if unknown:
        raise TypeError(f"log_context() got unknown ids: {', '.join(sorted(unknown))}")
    merged = {**_log_ids.get(), **{k: str(v) for k, v in ids.items() if v is not None}}
    ids_token = _log_ids.set(merged)
    cid_token = _correlation_id.set(correlation_id) if correlation_id else None
    try:
        yield
    finally:
        if cid_token is not None:
            _correlation_id.reset(cid_token)
        _log_ids.reset(ids_token)


def bind_log_ids(**ids: object) -> None:
    """Add ids to the enclosing ``log_context`` block, from here to its end.

    For an id learnt halfway through the work, such as the tenant of a request once its
    credential has been checked: the block that encloses the work still restores what was
    there before it when it ends. Outside any block, the ids stay bound in the current
    context (a thread's), so call it only inside one.
    """
    unknown = set(ids) - set(LOG_IDS)
    if unknown:
        raise TypeError(f"bind_log_ids() got unknown ids: {', '.join(sorted(unknown))}")
    _log_ids.set({**_log_ids.get(), **{k: str(v) for k, v in ids.items() if v is not None}})
