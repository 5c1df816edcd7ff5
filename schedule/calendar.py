"""A schedule's calendar: a five-field cron expression read in an IANA time zone.

cronsim does the arithmetic, with Debian cron's daylight-saving rules: an expression at a
fixed time of day ("30 2 * * *") runs once a day whatever the clock does (a 02:30 that
does not exist runs at the next valid minute, 03:00; a 01:30 that happens twice runs at
the first), while one whose minute or hour is a wildcard ("*/15 * * * *") follows the
time that passes. Due times leave this module as aware UTC datetimes: the key of a run.
"""

from __future__ import annotations

import functools
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

from cronsim import CronSim, CronSimError

CRON_FIELDS = 5
CRON_MAX_LENGTH = 200
ZONE_MAX_LENGTH = 64
# How far back the search for the latest missed due time starts: an expression that fires
# every minute finds it within this window after a short walk; a sparser one that has no due
# time in it is walked from where it was, which takes few steps for it.
_RECENT = timedelta(days=2)
# What reading a stored expression or zone the checks below would refuse raises.
UNREADABLE = (CronSimError, ValueError, zoneinfo.ZoneInfoNotFoundError)


@functools.cache
def _zone_names() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone (None when it is one)."""
    if not isinstance(name, str) or not name:
        return "An IANA time zone name is required, e.g. America/Sao_Paulo."
    # Only names of the database: no file paths, no POSIX TZ strings.
    if len(name) > ZONE_MAX_LENGTH or name not in _zone_names():
        return f"{name!r} is not an IANA time zone name (e.g. America/Sao_Paulo, UTC)."
    return None


def cron_problem(expression: object) -> str | None:
    """Why ``expression`` is not a five-field cron expression (None when it is one)."""
    if not isinstance(expression, str) or not expression.strip():
        return "A cron expression is required, e.g. '0 6 * * 1-5'."
    if len(expression) > CRON_MAX_LENGTH:
        return f"At most {CRON_MAX_LENGTH} characters."
    fields = expression.split()
    if len(fields) != CRON_FIELDS:
        return (
            f"Five fields (minute hour day-of-month month day-of-week) are expected; "
            f"got {len(fields)}."
        )
    try:
        # The first due time: also refuses an expression that never matches ("0 0 30 2 *").
        next(CronSim(expression, datetime.now(UTC)))
    except (CronSimError, ValueError) as exc:
        return f"Not a valid cron expression: {exc}."
    except StopIteration:
        return "The expression never matches a date."
    return None


def normalized(expression: str) -> str:
    """The expression with single spaces between its fields."""
    return " ".join(expression.split())


def due_times_after(expression: str, zone: str, after: datetime) -> Iterator[datetime]:
    """Due times strictly after ``after``, in order, as aware UTC datetimes."""
    local = after.astimezone(zoneinfo.ZoneInfo(zone))
    previous = after
    for due in CronSim(expression, local):
        moment = due.astimezone(UTC)
        # A repeated wall-clock minute maps to a moment already given: it is not a new run.
        if moment > previous:
            previous = moment
            yield moment


def next_due_after(expression: str, zone: str, after: datetime) -> datetime | None:
    """The first due time strictly after ``after`` (None if it never comes again)."""
    return next(due_times_after(expression, zone, after), None)


def latest_due_between(
    expression: str, zone: str, *, since: datetime, until: datetime
) -> datetime | None:
    """The latest due time in ``[since, until]``: the one a late schedule runs."""
    recent = max(since, until - _RECENT)
    latest = _last_due(expression, zone, start=recent, until=until)
    if latest is None and recent > since:
        # Nothing due lately: a sparse expression, walked from where it was (few steps).
        latest = _last_due(expression, zone, start=since, until=until)
    return latest


def _last_due(expression: str, zone: str, *, start: datetime, until: datetime) -> datetime | None:
    latest = None
    for due in due_times_after(expression, zone, start - timedelta(microseconds=1)):
        if due > until:
            break
        latest = due
    return latest
