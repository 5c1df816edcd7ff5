"""The calendar: cron expressions and zones checked, due times found, every search bounded."""

from __future__ import annotations

from datetime import timedelta
from itertools import islice
from zoneinfo import ZoneInfo

import pytest

from schedule.calendar import (
    cron_problem,
    due_times_after,
    latest_due_between,
    next_due_after,
    zone_problem,
)
from tests.schedule.support import utc


def walls(expression: str, zone: str, after, count: int) -> list[str]:
    """The next due times, read on the zone's wall clock."""
    return [
        due.astimezone(ZoneInfo(zone)).isoformat()
        for due in islice(due_times_after(expression, zone, after), count)
    ]


@pytest.mark.parametrize(
    "expression",
    [
        "0 6 * * 1-5",
        "*/15 * * * *",
        "0 0 L * *",
        "0 9 * * MON",
        "0 9 * jan-MAR mon-fri",
        "5/15 * * * *",
    ],
)
def test_five_field_expressions_are_accepted(expression):
    assert cron_problem(expression) is None


@pytest.mark.parametrize(
    "expression",
    [
        "",
        "   ",
        "@daily",
        "0 6 * *",
        "0 0 6 * * *",
        "0 25 * * *",
        "a b c d e",
        "0 0 15W * *",
        "0 0 * * 5#3",
        "0 0 * * 5L",
        "0 0 ? * 1",
        "0 0 LW * *",
        "*/0 * * * *",
        "5-1 * * * *",
        "0 0 30 2 *",
    ],
)
def test_anything_else_is_refused_with_a_reason(expression):
    assert cron_problem(expression)


@pytest.mark.parametrize("name", ["UTC", "America/Sao_Paulo", "Europe/Lisbon", "US/Eastern"])
def test_iana_zone_names_are_accepted(name):
    assert zone_problem(name) is None


@pytest.mark.parametrize(
    "name",
    [
        "",
        "Mars/Base",
        "/etc/localtime",
        "../UTC",
        "EST5EDT,M3",
        3,
        "localtime",
        "posixrules",
        "Factory",
        "posix/UTC",
        "right/UTC",
        "zone.tab",
        "tzdata.zi",
    ],
)
def test_other_zones_are_refused(name):
    assert zone_problem(name)


def test_the_latest_due_time_of_a_sparse_expression_is_found_years_back():
    latest = latest_due_between("0 0 29 2 *", "UTC", since=utc(2019, 1, 1), until=utc(2026, 6, 1))

    assert latest == utc(2024, 2, 29)


def test_the_latest_due_time_is_inclusive_of_both_ends():
    assert latest_due_between(
        "0 6 * * *", "UTC", since=utc(2026, 6, 1, 6), until=utc(2026, 6, 1, 6)
    ) == utc(2026, 6, 1, 6)
    assert (
        latest_due_between(
            "0 6 * * *", "UTC", since=utc(2026, 6, 1, 6, 0, 1), until=utc(2026, 6, 2, 5)
        )
        is None
    )


def test_the_next_due_time_is_strictly_after():
    assert next_due_after("0 6 * * *", "UTC", utc(2026, 6, 1, 6)) == utc(2026, 6, 2, 6)


# --- the cases from the field ------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_chatham_every_15_minutes_at_3_across_the_repeated_hour_answers_at_once():
    # Pacific/Chatham sets its clocks back from 03:45 (+13:45) to 02:45 (+12:45) on
    # 2027-04-04: the 03:00-03:44 that just passed comes again. 13:45:30Z is 03:30:30 +13:45.
    assert walls("*/15 3 * * *", "Pacific/Chatham", utc(2027, 4, 3, 13, 45, 30), 5) == [
        "2027-04-04T03:00:00+12:45",
        "2027-04-04T03:15:00+12:45",
        "2027-04-04T03:30:00+12:45",
        "2027-04-04T03:45:00+12:45",
        "2027-04-05T03:00:00+12:45",
    ]


def test_lord_howe_every_6_hours_after_its_30_minute_change_runs_at_0600():
    # Australia/Lord_Howe goes from +11 to +10:30 at 02:00 on 2026-04-05.
    assert walls("0 */6 * * *", "Australia/Lord_Howe", utc(2026, 4, 4, 12), 4) == [
        "2026-04-05T00:00:00+11:00",
        "2026-04-05T06:00:00+10:30",
        "2026-04-05T12:00:00+10:30",
        "2026-04-05T18:00:00+10:30",
    ]


def test_santiago_every_2_hours_on_sunday_when_midnight_does_not_exist_starts_at_0200():
    # America/Santiago: Saturday 2026-09-05 24:00 (-04) is Sunday 01:00 (-03).
    assert walls("0 */2 * * 0", "America/Santiago", utc(2026, 9, 5, 12), 3) == [
        "2026-09-06T02:00:00-03:00",
        "2026-09-06T04:00:00-03:00",
        "2026-09-06T06:00:00-03:00",
    ]


def test_a_fixed_midnight_run_on_the_day_midnight_does_not_exist_runs_at_0100():
    assert walls("0 0 * * 0", "America/Santiago", utc(2026, 9, 5, 12), 2) == [
        "2026-09-06T01:00:00-03:00",
        "2026-09-13T00:00:00-03:00",
    ]


def test_a_range_with_a_step_steps_inside_the_range_only():
    assert walls("10-10/5 * * * *", "UTC", utc(2026, 6, 1, 9, 10), 2) == [
        "2026-06-01T10:10:00+00:00",
        "2026-06-01T11:10:00+00:00",
    ]


def test_a_value_with_a_step_runs_to_the_end_of_the_field():
    assert walls("50/5 * * * *", "UTC", utc(2026, 6, 1, 9, 0), 3) == [
        "2026-06-01T09:50:00+00:00",
        "2026-06-01T09:55:00+00:00",
        "2026-06-01T10:50:00+00:00",
    ]


def test_both_day_fields_restricted_match_either_and_a_wildcard_step_counts_as_a_wildcard():
    # The 13th or any Friday (Vixie's rule), in June 2026 (the 13th is a Saturday).
    assert walls("0 0 13 6 5", "UTC", utc(2026, 6, 1), 3) == [
        "2026-06-05T00:00:00+00:00",
        "2026-06-12T00:00:00+00:00",
        "2026-06-13T00:00:00+00:00",
    ]
    # "*/2" starts with "*": odd days that are also Mondays.
    assert walls("0 0 */2 6 1", "UTC", utc(2026, 5, 31), 2) == [
        "2026-06-01T00:00:00+00:00",
        "2026-06-15T00:00:00+00:00",
    ]


def test_seven_and_zero_are_sunday_and_names_work_in_ranges():
    assert walls("0 12 * * 7", "UTC", utc(2026, 6, 1), 1) == ["2026-06-07T12:00:00+00:00"]
    assert walls("0 12 * * fri-7", "UTC", utc(2026, 6, 1), 3) == [
        "2026-06-05T12:00:00+00:00",
        "2026-06-06T12:00:00+00:00",
        "2026-06-07T12:00:00+00:00",
    ]
    assert walls("0 12 * JUN-jul SAT", "UTC", utc(2026, 6, 1), 1) == ["2026-06-06T12:00:00+00:00"]
    # Sunday is 0 in a range, as in Vixie cron: Friday to Sunday is "5-7", not "fri-sun".
    assert "5-7" in cron_problem("0 12 * * fri-sun")


def test_the_last_day_of_the_month():
    assert walls("0 0 L * *", "UTC", utc(2028, 1, 31, 1), 2) == [
        "2028-02-29T00:00:00+00:00",
        "2028-03-31T00:00:00+00:00",
    ]


# --- bounds ------------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_the_rarest_valid_expression_is_found_across_its_40_year_gap():
    # February 29 on a Sunday ("*/7" is 0 and 7: Sunday; it starts with "*", so both day
    # fields must match): 2088, then 2128 (2100 is no leap year).
    assert next_due_after("0 0 29 2 */7", "UTC", utc(2088, 3, 1)) == utc(2128, 2, 29)
    assert cron_problem("0 0 29 2 */7") is None


@pytest.mark.timeout(30)
def test_an_expression_whose_every_time_falls_in_a_gap_is_refused_for_that_zone():
    # Hour 2 of the second Sunday of March never exists in New York.
    expression = "*/15 2 8-14 3 */7"
    assert cron_problem(expression, "UTC") is None
    problem = cron_problem(expression, "America/New_York")
    assert problem and "no due time" in problem


def test_a_day_the_zone_skipped_runs_its_fixed_times_at_the_first_minute_after_it():
    # Pacific/Apia went from 2011-12-29 23:59 (-10) to 2011-12-31 00:00 (+14).
    assert walls("0 10 * * *", "Pacific/Apia", utc(2011, 12, 29, 12), 3) == [
        "2011-12-29T10:00:00-10:00",
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T10:00:00+14:00",
    ]
    assert walls("0 */12 * * *", "Pacific/Apia", utc(2011, 12, 29, 12), 3) == [
        "2011-12-29T12:00:00-10:00",
        "2011-12-31T00:00:00+14:00",
        "2011-12-31T12:00:00+14:00",
    ]


def test_every_minute_in_a_repeated_hour_runs_in_both_copies_each_instant_once():
    # 01:00-01:59 EDT (05:00-05:59Z), then 01:00-01:59 EST (06:00-06:59Z), then the next day.
    *hour, tomorrow = islice(
        due_times_after("* 1 * * *", "America/New_York", utc(2026, 11, 1, 4)), 121
    )
    assert hour == [utc(2026, 11, 1, 5) + timedelta(minutes=n) for n in range(120)]
    assert tomorrow == utc(2026, 11, 2, 6)
