"""A schedule's calendar: a five-field cron expression read in an IANA time zone.

The evaluator is written here rather than borrowed: a cron expression is five small sets
(minutes, hours, days of the month, months, days of the week) and the one rule that joins
the two day fields, so reading them is short; what a library cannot give us is the
daylight-saving rule, which is the product's promise, and a bound on every search. cronsim,
which this module used before, walks wall-clock candidates and lost its way across repeated
hours of zones whose offsets are not whole hours (a search that never returned). Owning the
walk lets each of its steps be stated, tested against two independent references
(``tests/schedule/test_cron_conformance.py``) and bounded.

The semantics (docs/schedules.md, "Writing a schedule", says the same for the people who
write schedules):

* Fields are ISC/Vixie cron's: ``*``, numbers, ranges ``a-b``, lists ``a,b``, steps ``*/n``
  and ``a-b/n`` (stepping inside the range only: ``10-10/5`` is 10 alone) and ``a/n``
  (``a-max/n``); names ``jan``-``dec`` and ``sun``-``sat`` in any case, in ranges and lists
  too; 0 and 7 are both Sunday. ``L`` alone in the day-of-month field is the month's last
  day. ``W``, ``#``, ``?``, ``L`` in the day-of-week field and the ``@daily`` nicknames are
  refused with a reason (write the five fields).
* Day of month and day of week: when both are restricted (neither field starts with
  ``*``) a day matches if either matches, Vixie's rule; otherwise both must match (so
  ``*/2`` in one field counts as a wildcard, as in Vixie cron).
* Daylight saving. An expression whose minute and hour fields do not start with ``*``
  names fixed times of day (``30 2 * * *``, ``0 9,17 * * 1-5``): each runs once on each
  matching day; a wall time that does not exist that day runs at the first minute after
  the gap, and one that happens twice runs at its first occurrence. An expression whose
  minute or hour field starts with ``*`` follows elapsed time: it runs at every matching
  wall time that exists, in both copies of a repeated hour, and not at all in a gap.
  This is Debian's and ISC cron's rule for changes of up to three hours; for the rare
  larger jumps (Pacific/Apia skipping 2011-12-30) cron gives up, while here the same rule
  still holds: a skipped day's fixed-time runs start at the first minute after the gap.
  Two times that land on the same instant are one run.
* Bounds: a search for the next due time looks at most ``SEARCH_YEARS`` of calendar days
  ahead and at most ``CANDIDATE_LIMIT`` wall times that gave no due time. The rarest
  valid day pattern, February 29 on one day of the week (``0 0 29 2 */7``), recurs within
  40 years, so a day pattern not met in 50 years is never met; a wall time in a gap wastes
  at most a day of candidates. Reaching a bound raises ``CalendarLimit`` (a 400 when a
  schedule is written, a paused schedule with the reason when it fires).

Due times leave this module as aware UTC datetimes: the key of a run.
"""

from __future__ import annotations

import calendar as gregorian
import functools
import heapq
import re
import zoneinfo
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path
from typing import Any

CRON_FIELDS = 5
CRON_MAX_LENGTH = 200
ZONE_MAX_LENGTH = 64
# How far ahead one search looks (calendar days): see the module docstring.
SEARCH_YEARS = 50
# Wall times examined without finding a due time before a search gives up.
CANDIDATE_LIMIT = 10_000
# No zone's offset reaches a day: a wall time's instant is within a day of it read as UTC.
_OFFSET_BOUND = timedelta(days=1)
# How far ahead a clock change can move the wall clock back below where it is now.
_SWING = timedelta(hours=27)


class CronError(ValueError):
    """An expression that is not a supported cron expression; the message says why."""


class ZoneError(ValueError):
    """A name that is not an IANA time zone."""


class CalendarLimit(Exception):
    """A search for a due time reached its bound (see ``SEARCH_YEARS``)."""


# What reading a stored calendar can raise: the firing pauses the schedule with the reason.
UNREADABLE = (CronError, ZoneError, CalendarLimit)


# --- time zones -----------------------------------------------------------------------------

# Files beside the zones that are not zones, for systems without tzdata.zi.
_NOT_ZONES = frozenset({"localtime", "posixrules", "Factory"})
_NOT_ZONE_PREFIXES = ("posix/", "right/", "SystemV/")


@functools.cache
def zone_names() -> frozenset[str]:
    """Every name of the tz database: its zones and its backward-compatible links.

    Read from the database's own list (``tzdata.zi``) where it is installed, so that files
    that sit beside the zones (``localtime``, ``posixrules``) are not taken for zones.
    """
    if (listed := _listing()) is not None:
        names, links = listed
        return frozenset((names | set(links)) - _NOT_ZONES)
    return frozenset(
        name
        for name in zoneinfo.available_timezones()
        if name not in _NOT_ZONES and not name.startswith(_NOT_ZONE_PREFIXES)
    )


@functools.cache
def _listing() -> tuple[frozenset[str], dict[str, str]] | None:
    """The zones and the links (name: the zone it names) of ``tzdata.zi``, where it is."""
    for folder in zoneinfo.TZPATH:
        listing = Path(folder) / "tzdata.zi"
        if listing.is_file():
            names, links = set(), {}
            for line in listing.read_text(encoding="utf-8").splitlines():
                parts = line.split()
                if len(parts) > 1 and parts[0] == "Z":
                    names.add(parts[1])
                elif len(parts) > 2 and parts[0] == "L":  # "L target name"
                    links[parts[2]] = parts[1]
            return frozenset(names), links
    return None


def zone_problem(name: object) -> str | None:
    """Why ``name`` is not an IANA time zone this server can read (None when it is one)."""
    if problem := _name_problem(name):
        return problem
    try:
        _load(str(name))
    except ZoneError as exc:
        return str(exc)
    return None


def zone_of(name: str) -> zoneinfo.ZoneInfo:
    if problem := _name_problem(name):
        raise ZoneError(problem)
    return _load(name)


def _name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "An IANA time zone name is required, e.g. America/Sao_Paulo."
    # Only names of the database: no file paths, no POSIX TZ strings, no local files.
    if len(name) > ZONE_MAX_LENGTH or name not in zone_names():
        return f"{name!r} is not an IANA time zone name (e.g. America/Sao_Paulo, UTC)."
    return None


def _load(name: str) -> zoneinfo.ZoneInfo:
    """The zone of a listed name, read through its link when the link has no file.

    Listed is not installed: Debian 13 lists the backward-compatible links (``US/Eastern``)
    in tzdata.zi but ships their files apart (``tzdata-legacy``). A link names its zone, so
    it is read as that zone: a schedule written with it keeps running after such an
    upgrade. A name that cannot be read either way is refused with the reason.
    """
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError) as exc:
        listed = _listing()
        target = listed[1].get(name) if listed is not None else None
        if target is not None:
            try:
                return zoneinfo.ZoneInfo(target)
            except (zoneinfo.ZoneInfoNotFoundError, ValueError, OSError):
                pass
        raise ZoneError(
            f"{name!r} cannot be read from this server's time zone database ({exc})"
        ) from exc


# --- expressions ----------------------------------------------------------------------------

# Cron's English names, whatever the process's locale (calendar.month_abbr follows it).
_MONTH_NAMES = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
_MONTHS = {name: n for n, name in enumerate(_MONTH_NAMES, start=1)}
_WEEKDAYS = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int]


_FIELDS = (
    _Field("minute", 0, 59, {}),
    _Field("hour", 0, 23, {}),
    _Field("day-of-month", 1, 31, {}),
    _Field("month", 1, 12, _MONTHS),
    _Field("day-of-week", 0, 7, _WEEKDAYS),
)
_ITEM = re.compile(
    r"^(?:(?P<star>\*)|(?P<first>[0-9a-z]+)(?:-(?P<last>[0-9a-z]+))?)(?:/(?P<step>[0-9]+))?$"
)
_NICKNAMES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


@dataclass(frozen=True)
class Cron:
    """A parsed expression: the sets it names and how its day fields combine."""

    times: tuple[tuple[int, int], ...]  # (hour, minute), in order
    days: frozenset[int]
    last_day: bool
    months: frozenset[int]
    weekdays: frozenset[int]  # 0 is Sunday
    # Vixie's rule: both day fields restricted, so either may match.
    either_day: bool
    # Neither the minute nor the hour field starts with "*": fixed times of day.
    fixed: bool

    def matches(self, day: date) -> bool:
        if day.month not in self.months:
            return False
        in_month = day.day in self.days or (
            self.last_day and day.day == gregorian.monthrange(day.year, day.month)[1]
        )
        in_week = (day.weekday() + 1) % 7 in self.weekdays
        return (in_month or in_week) if self.either_day else (in_month and in_week)


def _number(text: str, spec: _Field) -> int:
    if text.isdigit():
        value = int(text)
    elif text in spec.names:
        value = spec.names[text]
    else:
        raise CronError(f"{text!r} is not a value of the {spec.name} field")
    if not spec.low <= value <= spec.high:
        raise CronError(
            f"{value} is out of range for the {spec.name} field ({spec.low}-{spec.high})"
        )
    return value


def _refuse_extensions(item: str, spec: _Field) -> None:
    """The Quartz-style extensions some cron dialects have, refused with a reason."""
    if "?" in item:
        raise CronError(f"'?' is not supported: write '*' in the {spec.name} field")
    if "#" in item:
        raise CronError(f"'#' (the nth weekday of the month) is not supported ({item!r})")
    if spec.name == "day-of-month" and item.endswith("w") and item[:-1].isdigit():
        raise CronError(f"'W' (the nearest weekday) is not supported ({item!r})")
    if spec.name == "day-of-month" and "l" in item:
        raise CronError(f"'L' stands alone in the day-of-month field ({item!r})")
    if spec.name == "day-of-week" and item.endswith("l") and item[:-1].isdigit():
        raise CronError(f"'L' is supported in the day-of-month field only ({item!r})")


def _values(text: str, spec: _Field) -> set[int]:
    values: set[int] = set()
    for item in text.lower().split(","):
        if spec.name == "day-of-month" and item == "l":
            continue  # the month's last day, kept apart
        _refuse_extensions(item, spec)
        match = _ITEM.match(item)
        if match is None:
            raise CronError(f"{item!r} is not a value, range or step of the {spec.name} field")
        if match["star"]:
            first, last = spec.low, spec.high
        else:
            first = _number(match["first"], spec)
            if match["last"] is not None:
                last = _number(match["last"], spec)
                if last < first:
                    hint = (
                        " (Sunday is 0 or 7: Friday to Sunday is 5-7)"
                        if spec.names is _WEEKDAYS
                        else ""
                    )
                    raise CronError(
                        f"the range {item!r} of the {spec.name} field runs backwards{hint}"
                    )
            else:
                # "a/n" is "a-max/n", as in Vixie cron; a single value is itself.
                last = spec.high if match["step"] is not None else first
        step = 1
        if match["step"] is not None:
            step = int(match["step"])
            if not 1 <= step <= spec.high:
                raise CronError(f"the step of {item!r} must be between 1 and {spec.high}")
        values.update(range(first, last + 1, step))
    return values


@functools.lru_cache(maxsize=4096)
def parse(expression: str) -> Cron:
    """The expression read, or ``CronError`` with the reason."""
    fields = expression.split()
    if len(fields) == 1 and fields[0].startswith("@"):
        equivalent = _NICKNAMES.get(fields[0].lower())
        hint = f": write {equivalent!r}" if equivalent else ""
        raise CronError(f"nicknames such as {fields[0]!r} are not supported{hint}")
    if len(fields) != CRON_FIELDS:
        raise CronError(
            f"five fields (minute hour day-of-month month day-of-week) are expected; "
            f"got {len(fields)}"
        )
    minute, hour, dom, month, dow = (
        _values(text, spec) for text, spec in zip(fields, _FIELDS, strict=True)
    )
    weekdays = frozenset(day % 7 for day in dow)
    return Cron(
        times=tuple((h, m) for h in sorted(hour) for m in sorted(minute)),
        days=frozenset(dom),
        last_day="l" in fields[2].lower().split(","),
        months=frozenset(month),
        weekdays=weekdays,
        either_day=not fields[2].startswith("*") and not fields[4].startswith("*"),
        fixed=not fields[0].startswith("*") and not fields[1].startswith("*"),
    )


def cron_problem(expression: object, zone: str = "UTC") -> str | None:
    """Why ``expression`` is not a usable cron expression (None when it is one): it must
    parse and have a due time ahead, in ``zone``, within the search's bound."""
    if not isinstance(expression, str) or not expression.strip():
        return "A cron expression is required, e.g. '0 6 * * 1-5'."
    if len(expression) > CRON_MAX_LENGTH:
        return f"At most {CRON_MAX_LENGTH} characters."
    try:
        parse(normalized(expression))
    except CronError as exc:
        return f"Not a valid cron expression: {exc}."
    if zone_problem(zone):
        return None  # the zone's own problem is reported on its own
    try:
        next_due_after(normalized(expression), zone, datetime.now(UTC))
    except CalendarLimit as exc:
        return f"The expression has no due time ahead: {exc}."
    return None


def normalized(expression: str) -> str:
    """The expression with single spaces between its fields."""
    return " ".join(expression.split())


# --- due times ------------------------------------------------------------------------------


def _instants(
    wall: datetime, zone: zoneinfo.ZoneInfo, *, fixed: bool
) -> tuple[list[datetime], datetime]:
    """The instants a wall time runs at, and the earliest instant it maps to.

    The earliest instants grow with the wall time (a repeated time's first copy, a missing
    time's end of gap), which is what lets the search release due times in order.
    """
    first = wall.replace(tzinfo=zone).astimezone(UTC)
    second = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == second:
        return [first], first
    if first.astimezone(zone).replace(tzinfo=None) == wall:
        # It happens twice (PEP 495: fold 0 is the first copy).
        return ([first] if fixed else [first, second]), first
    # It does not exist: fold 1 reads it with the offset after the change, so the change
    # lies between the two readings.
    change = _change_between(second, first, zone)
    return ([change] if fixed else []), change


def _change_between(before: datetime, after: datetime, zone: zoneinfo.ZoneInfo) -> datetime:
    """The first whole minute at or after the zone's change of offset in (before, after]."""
    offset_after = after.astimezone(zone).utcoffset()
    low, high = before, after  # offset(low) differs from the offset after; offset(high) is it
    while high - low > timedelta(seconds=1):
        middle = low + (high - low) / 2
        middle = middle.replace(microsecond=0)
        if middle <= low:
            break
        if middle.astimezone(zone).utcoffset() == offset_after:
            high = middle
        else:
            low = middle
    if high.second or high.microsecond:
        high = high.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return high


def _first_wall(zone: zoneinfo.ZoneInfo, after: datetime) -> datetime:
    """The lowest wall time whose run can come after ``after``: the wall clock now, or
    lower if a change in the coming hours sets it back."""
    lowest = min(
        (after + timedelta(hours=hour)).astimezone(zone).utcoffset()
        for hour in range(int(_SWING / timedelta(hours=1)) + 1)
    )
    return (after.astimezone(UTC) + lowest).replace(tzinfo=None, second=0, microsecond=0)


def _next_day(cron: Cron, day: date) -> date:
    if day.month in cron.months:
        return day + timedelta(days=1)
    # Skip the rest of a month the expression does not name.
    if day.month == 12:
        return date(day.year + 1, 1, 1)
    return date(day.year, day.month + 1, 1)


def due_times_after(expression: str, zone: str, after: datetime) -> Iterator[datetime]:
    """Due times strictly after ``after``, in order, as aware UTC datetimes.

    Each step to the next due time is bounded; reaching a bound raises ``CalendarLimit``.
    """
    cron = parse(expression)
    tz = zone_of(zone)
    return _search(cron, tz, zone, after.astimezone(UTC))


def _search(cron: Cron, tz: zoneinfo.ZoneInfo, zone: str, after: datetime) -> Iterator[datetime]:
    start = _first_wall(tz, after)
    day = start.date()
    limit = day + timedelta(days=366 * SEARCH_YEARS)
    examined = 0
    pending: list[datetime] = []  # instants found, released once nothing earlier can come
    last = after

    def release(floor: datetime) -> Iterator[datetime]:
        nonlocal last, limit, examined
        while pending and pending[0] <= floor:
            moment = heapq.heappop(pending)
            if moment > last:
                last = moment
                limit = day + timedelta(days=366 * SEARCH_YEARS)
                examined = 0
                yield moment

    while True:
        floor = datetime.combine(day, time(), tzinfo=UTC) - _OFFSET_BOUND
        yield from release(floor)
        if day > limit:
            raise CalendarLimit(
                f"no due time within {SEARCH_YEARS} years after "
                f"{last.astimezone(tz).isoformat()} in {zone}"
            )
        if cron.matches(day):
            for hour, minute in cron.times:
                wall = datetime.combine(day, time(hour, minute))
                if wall < start:
                    continue
                examined += 1
                if examined > CANDIDATE_LIMIT:
                    raise CalendarLimit(
                        f"{CANDIDATE_LIMIT} times after {last.astimezone(tz).isoformat()} "
                        f"examined in {zone} without a due time"
                    )
                moments, earliest = _instants(wall, tz, fixed=cron.fixed)
                yield from release(earliest)
                for moment in moments:
                    if moment > last:
                        heapq.heappush(pending, moment)
        try:
            day = _next_day(cron, day)
        except (OverflowError, ValueError) as exc:
            raise CalendarLimit(f"no due time before the end of the calendar in {zone}") from exc


def next_due_after(expression: str, zone: str, after: datetime) -> datetime:
    """The first due time strictly after ``after`` (``CalendarLimit`` if none in bound)."""
    return next(due_times_after(expression, zone, after))


def due_times_between(
    expression: str, zone: str, *, since: datetime, until: datetime, limit: int
) -> list[datetime]:
    """The due times in ``[since, until]``, in order, at most ``limit`` of them (the
    earliest ones)."""
    found: list[datetime] = []
    if since > until or limit <= 0:
        return found
    for due in due_times_after(expression, zone, since - timedelta(microseconds=1)):
        if due > until:
            break
        found.append(due)
        if len(found) >= limit:
            break
    return found


def latest_due_between(
    expression: str, zone: str, *, since: datetime, until: datetime
) -> datetime | None:
    """The latest due time in ``[since, until]``: the one a late schedule runs.

    Walks the calendar days back from ``until``: the latest matching day with a due time in
    the window holds the answer (the day before it too, when a clock set back past midnight
    repeated its last hour after the next day began).
    """
    cron = parse(expression)
    tz = zone_of(zone)
    since, until = since.astimezone(UTC), until.astimezone(UTC)
    if since > until:
        return None
    day = (until + _OFFSET_BOUND).astimezone(tz).date() + timedelta(days=1)
    stop = (since - _OFFSET_BOUND).astimezone(tz).date() - timedelta(days=1)
    oldest = day - timedelta(days=366 * SEARCH_YEARS)
    found: datetime | None = None
    examined = 0
    while day >= stop and day >= oldest:
        if cron.matches(day):
            for hour, minute in cron.times:
                examined += 1
                if examined > CANDIDATE_LIMIT * 2:
                    raise CalendarLimit(
                        f"{examined} times before {until.isoformat()} examined in {zone}"
                    )
                for moment in _instants(
                    datetime.combine(day, time(hour, minute)), tz, fixed=cron.fixed
                )[0]:
                    if since <= moment <= until and (found is None or moment > found):
                        found = moment
            if found is not None:
                # One more day back, for a repeated hour that crossed midnight.
                previous = day - timedelta(days=1)
                if cron.matches(previous):
                    for hour, minute in cron.times:
                        wall = datetime.combine(previous, time(hour, minute))
                        for moment in _instants(wall, tz, fixed=cron.fixed)[0]:
                            if since <= moment <= until and moment > found:
                                found = moment
                return found
        day -= timedelta(days=1)
    return found


class BatchCalendar:
    """The calendar for one batch of schedules: each search answered once per arguments.

    The due schedules of a batch share few (expression, zone) pairs, the same ``now`` and,
    when they fell due together, the same ``since``: the firing asks this object instead of
    the module's functions, and each distinct search runs once. The answers are the
    functions' own, bounds included: a search that reaches its bound raises
    ``CalendarLimit`` again for every schedule that asks it (each is paused with the
    reason), without searching again. One object serves one batch (its ``now``): it keeps
    every answer it gave.
    """

    def __init__(self) -> None:
        self._answers: dict[tuple[object, ...], object] = {}

    def next_due_after(self, expression: str, zone: str, after: datetime) -> datetime:
        return self._answer(
            ("next", expression, zone, after), lambda: next_due_after(expression, zone, after)
        )

    def due_times_between(
        self, expression: str, zone: str, *, since: datetime, until: datetime, limit: int
    ) -> list[datetime]:
        return list(
            self._answer(
                ("between", expression, zone, since, until, limit),
                lambda: tuple(
                    due_times_between(expression, zone, since=since, until=until, limit=limit)
                ),
            )
        )

    def latest_due_between(
        self, expression: str, zone: str, *, since: datetime, until: datetime
    ) -> datetime | None:
        return self._answer(
            ("latest", expression, zone, since, until),
            lambda: latest_due_between(expression, zone, since=since, until=until),
        )

    def _answer(self, key: tuple[object, ...], search: Callable[[], Any]) -> Any:
        try:
            answer = self._answers[key]
        except KeyError:
            try:
                answer = search()
            except UNREADABLE as exc:
                answer = _Refused(exc)
            self._answers[key] = answer
        if isinstance(answer, _Refused):
            # A fresh exception each time: one raised again would grow its traceback.
            raise type(answer.error)(*answer.error.args)
        return answer


@dataclass(frozen=True)
class _Refused:
    """A search's refusal, kept to be raised again for the next schedule that asks."""

    error: Exception
