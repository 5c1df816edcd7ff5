"""The calendar: cron expressions and zones checked, due times found."""

from __future__ import annotations

import pytest

from schedule.calendar import cron_problem, latest_due_between, next_due_after, zone_problem
from tests.schedule.support import utc


@pytest.mark.parametrize("expression", ["0 6 * * 1-5", "*/15 * * * *", "0 0 L * *", "0 9 * * MON"])
def test_five_field_expressions_are_accepted(expression):
    assert cron_problem(expression) is None


@pytest.mark.parametrize(
    "expression", ["", "   ", "@daily", "0 6 * *", "0 0 6 * * *", "0 25 * * *", "a b c d e"]
)
def test_anything_else_is_refused_with_a_reason(expression):
    assert cron_problem(expression)


@pytest.mark.parametrize("name", ["UTC", "America/Sao_Paulo", "Europe/Lisbon"])
def test_iana_zone_names_are_accepted(name):
    assert zone_problem(name) is None


@pytest.mark.parametrize("name", ["", "Mars/Base", "/etc/localtime", "../UTC", "EST5EDT,M3", 3])
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
