"""Reads of the events trail, for the events API (``GET /api/v1/events``).

What a caller may see is decided here: a platform admin sees every event, the platform's
own (no tenant) among them; anyone else only their tenant's. Another tenant's events are
not refused, they are absent: a filter by another tenant's aggregate finds nothing.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import QuerySet

from common.queries import narrowed
from outbox.models import Event

# How much later an event may have been written than one with a greater id. An event's
# id is drawn before its row is written (in the same statement for ``publish``, in the
# statement before for ``publish_many``) and its ``occurred_at`` is the database's clock
# when the row is written, so ids follow ``occurred_at`` up to that gap: microseconds, or
# the time between two statements of one transaction. A time range is turned into an id
# range widened by this much, and the times themselves are still compared exactly, so
# the margin only costs the rows of that many minutes at each end of a range.
ID_ORDER_SKEW = timedelta(minutes=5)

# PostgreSQL's bigint, the id column's type: above every id.
_ABOVE_EVERY_ID = 2**63 - 1


def events_visible(*, tenant_id: int | None, platform_admin: bool) -> QuerySet[Event]:
    """The events a caller may read: every one for a platform admin, else their tenant's
    (none for a caller without a tenant)."""
    if platform_admin:
        return Event.objects.all()
    if tenant_id is None:
        return Event.objects.none()
    return Event.objects.filter(tenant_id=tenant_id)


def event_list(
    *,
    caller_tenant_id: int | None,
    platform_admin: bool,
    tenant_id: int | None = None,
    types: list[str] | None = None,
    aggregate_type: str | None = None,
    aggregate_id: str | None = None,
    actor: str | None = None,
    occurred_after: datetime | None = None,
    occurred_before: datetime | None = None,
) -> QuerySet[Event]:
    """The events the caller may read, newest first (by id, which the list's cursor keys
    on), narrowed by each filter given.

    Each filter alone is served in that order by an index of ``Event.Meta.indexes``, so a
    page reads about its own rows at any depth. ``occurred_after`` (inclusive) and
    ``occurred_before`` (exclusive) are also an id range, read first (one index row for
    each bound), which every one of those indexes bounds. Several ``types`` are not in one
    index's order: the planner reads each type's matches and sorts them, or walks the ids
    and skips the other types.
    """
    queryset = narrowed(
        events_visible(tenant_id=caller_tenant_id, platform_admin=platform_admin),
        tenant_id=tenant_id,
        aggregate_type=aggregate_type,
        aggregate_id=aggregate_id,
        actor=actor,
    )
    if types:
        queryset = queryset.filter(type__in=types)
    if occurred_after is not None:
        queryset = queryset.filter(
            occurred_at__gte=occurred_after, id__gt=_id_below_every_event_from(occurred_after)
        )
    if occurred_before is not None:
        queryset = queryset.filter(
            occurred_at__lt=occurred_before, id__lt=_id_above_every_event_until(occurred_before)
        )
    return queryset.order_by("-id")


# The bounds are read first, each one row of ``events_occurred_idx``, and given to the
# list's statement as numbers: the planner then knows how many ids the range holds and
# walks the list's index through it. (As subqueries of that statement their values are
# unknown when it is planned, and it read a tenant's range through the time index
# instead, every event of the range sorted.)


def _id_below_every_event_from(moment: datetime) -> int:
    """An id below that of every event at or after ``moment``: the id of an event written
    more than ``ID_ORDER_SKEW`` before it (the latest such), or 0 if there is none."""
    earlier = (
        Event.objects.filter(occurred_at__lt=moment - ID_ORDER_SKEW)
        .order_by("-occurred_at", "-id")
        .values_list("id", flat=True)
        .first()
    )
    return earlier if earlier is not None else 0


def _id_above_every_event_until(moment: datetime) -> int:
    """An id above that of every event before ``moment``: the id of an event written more
    than ``ID_ORDER_SKEW`` after it (the earliest such), or above every id if none is."""
    later = (
        Event.objects.filter(occurred_at__gte=moment + ID_ORDER_SKEW)
        .order_by("occurred_at", "id")
        .values_list("id", flat=True)
        .first()
    )
    return later if later is not None else _ABOVE_EVERY_ID
