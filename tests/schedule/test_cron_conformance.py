"""The calendar against two references, around every clock change of 2025-2028.

The first reference is a brute-force minute walker written here, sharing no code with
``schedule.calendar``: it reads the expression with its own parser and visits every UTC
minute of a window, asking of each one docs/schedules.md's rule in its plainest form (a wildcard
expression runs at each minute whose wall time matches; a fixed-time one at a wall time's
first occurrence, and at the first minute after a jump of the clock over a time it names).
The calendar must agree with it on every case: no difference is allowed.

The second is croniter (a test dependency), an implementation of cron that knows nothing
of this project. It reads some expressions differently from Vixie cron, and it has a
daylight-saving rule of its own; each difference is listed below with its reason, found
case by case (every differing due time must fall in one documented class), and counted.

``make test`` runs the quick form (every zone of the database that changes its clocks in
those years with a few expressions, the zones whose offsets or changes are not whole hours
with all of them); ``CHAOS=full`` runs every zone with every expression.
"""

from __future__ import annotations

import calendar as gregorian
import functools
import os
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import TZPATH, ZoneInfo, available_timezones

import pytest
from croniter import croniter

from schedule.calendar import (
    BatchCalendar,
    CalendarLimit,
    due_times_after,
    due_times_between,
    latest_due_between,
    next_due_after,
)

FULL = os.environ.get("CHAOS", "").strip().lower() == "full"
MINUTE = timedelta(minutes=1)
# Each case: the due times in (start, start + WINDOW], start three hours before a change.
BEFORE = timedelta(hours=3)
WINDOW = timedelta(hours=12)
# How far back the walker reads the clock, to know a repeated wall time: more than any
# change sets it back in these years (Antarctica/Troll's two hours).
LOOKBACK = timedelta(hours=6)
YEARS = range(2025, 2029)

EXPRESSIONS = [
    "*/15 * * * *",
    "0 * * * *",
    "30 * * * *",
    "15,45 * * * *",
    "*/10 0-3 * * *",
    "* 1 * * *",
    "*/5 2 * * *",
    "*/15 3 * * *",
    "0 */2 * * *",
    "0 */6 * * *",
    "0-59/20 1,2,3 * * *",
    "0 0 * * *",
    "30 0 * * *",
    "0 1 * * *",
    "30 1 * * *",
    "0 2 * * *",
    "30 2 * * *",
    "45 2 * * *",
    "15 3 * * *",
    "59 23 * * *",
    "0 0,12 * * *",
    "0 1 * * 0",
    "0 0 * * 0",
    "0 */2 * * 0",
    "0 0 * * 7",
    "0 0 1 * *",
    "0 12 L * *",
    "0 9 * * mon-fri",
    "0 0 13 * 5",
    "0 0 */2 * 1",
    "10-10/5 * * * *",
    "5/15 * * * *",
    "0 3 * jan-jun sun",
    "0 12 * * 1/2",
    "23 0-23/2 * * *",
    "0 0 29 2 *",
    "59 23 31 12 *",
]
# Every zone gets these (all of them under CHAOS=full).
FEW = ["*/15 * * * *", "* 1 * * *", "0 0 * * *", "30 1 * * *", "30 2 * * *", "0 */2 * * 0"]

# Expressions croniter reads otherwise than Vixie cron, whatever the zone (checked in UTC
# below, so that each line stays true).
CRONITER_READS_OTHERWISE = {
    "0 0 */2 * 1": "croniter lets either day field match when one is '*/2'; in Vixie cron a "
    "field that starts with '*' is a wildcard, so both must match",
    "10-10/5 * * * *": "croniter steps past the end of the range (:10, :15 ... :55); ISC cron "
    "steps inside it (:10 only)",
    "0 12 * * 1/2": "croniter stops '1/2' at Saturday; Vixie's a/n runs to the field's end, 7, "
    "so Sunday is in it",
}

# What croniter does around a clock change that the documented rule does not.
CRONITER_DST = {
    "repeats a fixed time": "a fixed time of day that happens twice runs in both copies "
    "(the rule: at the first only)",
    "runs a missing wildcard time": "a wildcard expression's time that the clock skips "
    "runs at the end of the gap (the rule: not at all; it follows elapsed time)",
    "runs a repeated wildcard time once": "in some zones (Chatham's 45-minute offsets) a "
    "wildcard expression's time that happens twice runs in the first copy only (the rule: "
    "in both, as elapsed time passes through both)",
}


# --- the walker's own reading of an expression -------------------------------------------------

MONTH_NAMES = {name.lower(): n for n, name in enumerate(gregorian.month_abbr) if name}
DAY_NAMES = {name: n for n, name in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}


def expand(field: str, low: int, high: int, names: dict[str, int]) -> set[int]:
    def number(text: str) -> int:
        return names[text] if text in names else int(text)

    out: set[int] = set()
    for part in field.lower().split(","):
        every, stepped = 1, "/" in part
        if stepped:
            part, step = part.split("/")
            every = int(step)
        if part == "*":
            first, last = low, high
        elif "-" in part:
            a, b = part.split("-")
            first, last = number(a), number(b)
        else:
            first = number(part)
            last = high if stepped else first
        out.update(
            value
            for value in range(low, high + 1)
            if first <= value <= last and (value - first) % every == 0
        )
    return out


@functools.cache
def reading(expression: str):
    minute, hour, dom, month, dow = expression.split()
    last_day = "l" in dom.lower().split(",")
    dom_values = expand(",".join(p for p in dom.split(",") if p.lower() != "l") or "0", 1, 31, {})
    weekdays = {d % 7 for d in expand(dow, 0, 7, DAY_NAMES)}
    return {
        "minutes": expand(minute, 0, 59, {}),
        "hours": expand(hour, 0, 23, {}),
        "doms": dom_values,
        "last_day": last_day,
        "months": expand(month, 1, 12, MONTH_NAMES),
        "weekdays": weekdays,
        "either": not dom.startswith("*") and not dow.startswith("*"),
        "fixed": not minute.startswith("*") and not hour.startswith("*"),
    }


def named(expression: str, wall: datetime) -> bool:
    """Whether the expression names this wall-clock minute."""
    r = reading(expression)
    if wall.minute not in r["minutes"] or wall.hour not in r["hours"]:
        return False
    if wall.month not in r["months"]:
        return False
    last = gregorian.monthrange(wall.year, wall.month)[1]
    by_date = wall.day in r["doms"] or (r["last_day"] and wall.day == last)
    by_weekday = wall.isoweekday() % 7 in r["weekdays"]
    return (by_date or by_weekday) if r["either"] else (by_date and by_weekday)


class Clock:
    """A zone's wall clock over a window, minute by minute, read once."""

    def __init__(self, zone: str, start: datetime, end: datetime) -> None:
        self.zone = ZoneInfo(zone)
        self.start, self.end = start, end
        self.minutes: list[tuple[datetime, datetime]] = []  # (instant, wall)
        moment = start - LOOKBACK
        while moment <= end:
            self.minutes.append((moment, self.wall(moment)))
            moment += MINUTE
        self.first = next(i for i, (moment, _) in enumerate(self.minutes) if moment > start)

    def wall(self, moment: datetime) -> datetime:
        return moment.astimezone(self.zone).replace(tzinfo=None)

    @functools.cached_property
    def seen_before(self) -> list[bool]:
        """For each minute: whether its wall time was already read at an earlier minute."""
        seen: set[datetime] = set()
        out = []
        for _, wall in self.minutes:
            out.append(wall in seen)
            seen.add(wall)
        return out

    def walk(self, expression: str) -> list[datetime]:
        fixed = reading(expression)["fixed"]
        due = []
        for i in range(self.first, len(self.minutes)):
            moment, wall = self.minutes[i]
            previous = self.minutes[i - 1][1]
            if fixed:
                runs = named(expression, wall) and not self.seen_before[i]
                skipped = previous + MINUTE
                while not runs and skipped < wall:  # the clock jumped over these
                    runs = named(expression, skipped)
                    skipped += MINUTE
            else:
                runs = named(expression, wall)
            if runs:
                due.append(moment)
        return due

    def gap_end(self, moment: datetime, expression: str) -> bool:
        """Whether ``moment`` is the first minute after a jump over a time it names."""
        i = self.minutes.index((moment, self.wall(moment)))
        skipped = self.minutes[i - 1][1] + MINUTE
        while skipped < self.minutes[i][1]:
            if named(expression, skipped):
                return True
            skipped += MINUTE
        return False

    def repeated(self, moment: datetime) -> bool:
        return self.seen_before[self.minutes.index((moment, self.wall(moment)))]


# --- the cases ---------------------------------------------------------------------------------


def changes(zone: str) -> list[datetime]:
    """The zone's changes of offset in ``YEARS`` (to the minute)."""
    tz = ZoneInfo(zone)
    # No zone changes its clocks twice within three days.
    step = timedelta(days=3)
    moment = datetime(YEARS[0], 1, 1, tzinfo=UTC)
    end = datetime(YEARS[-1] + 1, 1, 1, tzinfo=UTC)
    found = []
    while moment < end:
        later = moment + step
        if moment.astimezone(tz).utcoffset() != later.astimezone(tz).utcoffset():
            low, high = moment, later
            while high - low > MINUTE:
                middle = low + (high - low) / 2
                if middle.astimezone(tz).utcoffset() == moment.astimezone(tz).utcoffset():
                    low = middle
                else:
                    high = middle
            found.append(high.replace(second=0, microsecond=0))
        moment = later
    return found


def odd(zone: str, moments: list[datetime]) -> bool:
    """A zone whose offset or whose change is not a whole number of hours."""
    tz = ZoneInfo(zone)
    for moment in moments:
        before = (moment - MINUTE).astimezone(tz).utcoffset()
        after = moment.astimezone(tz).utcoffset()
        if before.total_seconds() % 3600 or after.total_seconds() % 3600:
            return True
    return False


def canonical_zones() -> list[str]:
    """The tz database's zones (its links name the same data again)."""
    for folder in TZPATH:
        listing = Path(folder) / "tzdata.zi"
        if listing.is_file():
            lines = listing.read_text(encoding="utf-8").splitlines()
            return sorted(line.split()[1] for line in lines if line.startswith("Z "))
    return sorted(available_timezones() - {"localtime", "posixrules"})


@functools.cache
def zones_that_change() -> dict[str, list[datetime]]:
    return {
        name: found for name in canonical_zones() if name != "Factory" and (found := changes(name))
    }


# Zones compared with croniter in the quick form, beside the odd ones: a midnight change
# (Santiago, Havana), the southern hemisphere, a two-hour change (Troll), Europe, America.
CRONITER_ZONES = {
    "America/New_York",
    "America/Santiago",
    "America/Havana",
    "Australia/Sydney",
    "Antarctica/Troll",
    "Europe/London",
}


def ours(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    found = []
    for due in due_times_after(expression, zone, start):
        if due > end:
            break
        found.append(due)
    return found


def croniter_says(expression: str, zone: str, start: datetime, end: datetime) -> list[datetime]:
    it = croniter(expression, start.astimezone(ZoneInfo(zone)))
    found = []
    while len(found) < 2000:
        due = it.get_next(datetime).astimezone(UTC)
        if due > end:
            break
        found.append(due)
    return found


def croniter_differences(clock: Clock, expression: str, theirs, mine) -> set[str] | None:
    """The documented classes of croniter's differences on this case, each due time it
    adds or leaves out explained by one (None: one is unexplained)."""
    fixed = reading(expression)["fixed"]
    kinds = set()
    for moment in set(theirs) - set(mine):
        if fixed and clock.repeated(moment):
            kinds.add("repeats a fixed time")
        elif not fixed and clock.gap_end(moment, expression):
            kinds.add("runs a missing wildcard time")
        else:
            return None
    for moment in set(mine) - set(theirs):
        if not fixed and clock.repeated(moment):
            kinds.add("runs a repeated wildcard time once")
        else:
            return None
    return kinds


def cases() -> list[tuple[str, datetime, list[str], bool]]:
    """(zone, start, expressions, whether croniter is asked too)."""
    found = []
    for zone, moments in zones_that_change().items():
        special = odd(zone, moments)
        expressions = EXPRESSIONS if FULL or special else FEW
        with_croniter = FULL or special or zone in CRONITER_ZONES
        for moment in moments:
            found.append((zone, moment - BEFORE, expressions, with_croniter))
    # Days around none: every expression in UTC and in zones without changes, at instants
    # across the years (day-of-week and month rules, leap days, the turn of a year).
    for start in (
        datetime(2025, 12, 31, 20, tzinfo=UTC),
        datetime(2028, 2, 28, 16, tzinfo=UTC),
        datetime(2028, 2, 29, 4, tzinfo=UTC),
        datetime(2026, 6, 12, 22, tzinfo=UTC),
        datetime(2027, 3, 1, 0, 30, tzinfo=UTC),
    ):
        for zone in ("UTC", "Asia/Kolkata", "Asia/Kathmandu"):
            found.append((zone, start, EXPRESSIONS, True))
    # Days of the past that the rule covers too: Apia skipping 2011-12-30, Sao Paulo's
    # midnight changes, Kiritimati skipping 1994-12-31.
    for zone, start in (
        ("Pacific/Apia", datetime(2011, 12, 29, 12, tzinfo=UTC)),
        ("Pacific/Apia", datetime(2011, 12, 30, 0, tzinfo=UTC)),
        ("America/Sao_Paulo", datetime(2018, 11, 4, 0, tzinfo=UTC)),
        ("America/Sao_Paulo", datetime(2019, 2, 16, 23, tzinfo=UTC)),
        ("Pacific/Kiritimati", datetime(1994, 12, 31, 0, tzinfo=UTC)),
    ):
        found.append((zone, start, EXPRESSIONS, False))
    return found


def test_the_calendar_agrees_with_the_walker_and_differs_from_croniter_only_as_documented(
    capsys,
):
    compared = 0
    due_times = 0
    croniter_cases = 0
    differing = 0
    differences: Counter[str] = Counter()
    examples: dict[str, list[str]] = {}
    disagreements = []
    unexplained = []
    for zone, start, expressions, with_croniter in cases():
        end = start + WINDOW
        clock = Clock(zone, start, end)
        for expression in expressions:
            mine = ours(expression, zone, start, end)
            walked = clock.walk(expression)
            compared += 1
            due_times += len(walked)
            if mine != walked:
                disagreements.append((expression, zone, start.isoformat(), mine[:4], walked[:4]))
            if not with_croniter or expression in CRONITER_READS_OTHERWISE:
                continue
            theirs = croniter_says(expression, zone, start, end)
            croniter_cases += 1
            if theirs == mine:
                continue
            kinds = croniter_differences(clock, expression, theirs, mine)
            if kinds is None:
                unexplained.append((expression, zone, start.isoformat()))
                continue
            differing += 1
            for kind in kinds:
                differences[kind] += 1
                examples.setdefault(kind, []).append(
                    f"{expression!r} in {zone} from {start:%Y-%m-%d %H:%M}Z"
                )

    with capsys.disabled():
        print(
            f"\ncron conformance: {compared} cases ({due_times} due times) agree with the "
            f"walker; {croniter_cases} compared with croniter, "
            f"{differing} differ as documented:"
        )
        for kind, count in differences.most_common():
            print(f"  croniter {kind} ({CRONITER_DST[kind]}): {count}, e.g. {examples[kind][0]}")
        for expression, reason in CRONITER_READS_OTHERWISE.items():
            print(f"  {expression!r} not compared with croniter: {reason}")
    assert disagreements == []
    assert unexplained == []
    assert compared > (20_000 if FULL else 5_000)
    assert set(differences) == set(CRONITER_DST)  # each documented class still happens


def test_a_batch_s_shared_searches_answer_as_the_calendar_does_on_every_case():
    """The firing asks ``BatchCalendar`` (each search once per batch) where it asked the
    module's functions: on every case above, every search the firing makes answers the same,
    asked once or again."""
    compared = 0
    differing = []
    for zone, start, expressions, _ in cases():
        end = start + WINDOW
        searches = BatchCalendar()
        for expression in expressions:
            expected = (
                due_times_between(expression, zone, since=start, until=end, limit=1000),
                due_times_between(expression, zone, since=start, until=end, limit=3),
                next_due_after(expression, zone, start),
                next_due_after(expression, zone, end),
                latest_due_between(expression, zone, since=start, until=end),
            )
            for _ in range(2):
                shared = (
                    searches.due_times_between(
                        expression, zone, since=start, until=end, limit=1000
                    ),
                    searches.due_times_between(expression, zone, since=start, until=end, limit=3),
                    searches.next_due_after(expression, zone, start),
                    searches.next_due_after(expression, zone, end),
                    searches.latest_due_between(expression, zone, since=start, until=end),
                )
                compared += 1
                if shared != expected:
                    differing.append((expression, zone, start.isoformat()))
    assert differing == []
    assert compared > (40_000 if FULL else 10_000)


def test_a_batch_s_shared_search_that_reaches_its_bound_refuses_every_schedule_that_asks():
    # Every time of it falls in New York's gap: no due time within the bound.
    expression, zone = "*/15 2 8-14 3 */7", "America/New_York"
    after = datetime(2026, 6, 1, tzinfo=UTC)
    with pytest.raises(CalendarLimit) as alone:
        next_due_after(expression, zone, after)
    searches = BatchCalendar()
    for _ in range(3):
        with pytest.raises(CalendarLimit) as shared:
            searches.next_due_after(expression, zone, after)
        assert str(shared.value) == str(alone.value)


@pytest.mark.parametrize("expression", sorted(CRONITER_READS_OTHERWISE))
def test_croniter_still_reads_these_expressions_otherwise_and_the_walker_agrees_with_us(
    expression,
):
    start = datetime(2026, 6, 1, tzinfo=UTC)
    end = start + timedelta(days=14)
    clock = Clock("UTC", start, end)

    mine = ours(expression, "UTC", start, end)

    assert mine == clock.walk(expression)
    assert mine != croniter_says(expression, "UTC", start, end)
