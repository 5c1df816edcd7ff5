"""Reads of the events trail, for the events API (``GET /api/v1/events``).

What a caller may see is decided here: a platform admin sees every event, the platform's
own (no tenant) among them; anyone else only their tenant's. Another tenant's events are
not refused, they are absent: a filter by another tenant's aggregate finds nothing.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from django.db.models import BooleanField, Case, ExpressionWrapper, Q, QuerySet, Value, When

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
    ``occurred_before`` (exclusive) are also an id range, read first (two index rows for
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
        below = _last_id_before(_shifted(occurred_after, -ID_ORDER_SKEW))
        surely_in = _first_id_from(_shifted(occurred_after, ID_ORDER_SKEW))
        queryset = queryset.filter(
            _time_checked(
                Q(occurred_at__gte=occurred_after),
                holds_for=None if surely_in is None else Q(id__gte=surely_in),
            ),
            id__gt=below if below is not None else 0,
        )
    if occurred_before is not None:
        above = _first_id_from(_shifted(occurred_before, ID_ORDER_SKEW))
        surely_in = _last_id_before(_shifted(occurred_before, -ID_ORDER_SKEW))
        queryset = queryset.filter(
            _time_checked(
                Q(occurred_at__lt=occurred_before),
                holds_for=None if surely_in is None else Q(id__lte=surely_in),
            ),
            id__lt=above if above is not None else _ABOVE_EVERY_ID,
        )
    return queryset.order_by("-id")


# A time range as an id range: the ids of the events written more than ``ID_ORDER_SKEW``
# before and after each bound, each read first (one row of ``events_occurred_idx``) and
# given to the list's statement as numbers. Beyond the outer ones no event can be in the
# range, within the inner ones every event is: only the ids between them (the few minutes
# around each bound) have their time compared. Said so, the time is no second condition
# to the planner, as narrow as the ids and independent of them (it multiplied the two and
# expected a handful of rows, then sorted every match of a filter over the range instead
# of walking its index: 34 ms for a platform admin's JobFailed of the last 7 days at ten
# million events).


def _shifted(moment: datetime, by: timedelta) -> datetime:
    """``moment + by``, held at the calendar's first or last instant: a bound given in the
    first or last minutes of year 1 or 9999 widens to the whole calendar on that side."""
    try:
        return moment + by
    except OverflowError:
        end = datetime.min if by < timedelta(0) else datetime.max
        return end.replace(tzinfo=UTC)


def _time_checked(condition: Q, *, holds_for: Q | None) -> Q | Case:
    """``condition``, compared only where ``holds_for`` does not already settle it."""
    if holds_for is None:
        return condition
    return Case(
        When(holds_for, then=Value(True)),
        default=ExpressionWrapper(condition, output_field=BooleanField()),
        output_field=BooleanField(),
    )


def _last_id_before(moment: datetime) -> int | None:
    """The id of the latest event before ``moment`` (the greatest id among ties)."""
    return (
        Event.objects.filter(occurred_at__lt=moment)
        .order_by("-occurred_at", "-id")
        .values_list("id", flat=True)
        .first()
    )


def _first_id_from(moment: datetime) -> int | None:
    """The id of the earliest event at or after ``moment`` (the smallest id among ties)."""
    return (
        Event.objects.filter(occurred_at__gte=moment)
        .order_by("occurred_at", "id")
        .values_list("id", flat=True)
        .first()
    )
