"""Step 4: the checks of ``common.ways_forward``, run by the monitor each cycle.

The checks here are the test's own (each machine's real check is tested in its app's
folder, and through this step there): what is asserted is how the monitor runs them, counts
what they found and logs it.
"""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError
from prometheus_client import REGISTRY

from common import ways_forward
from common.ways_forward import Repaired, register_stranded_check, stranded_checks
from tests.observability.conftest import sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def checks(monkeypatch):
    """An empty registry for the test's own checks; the apps' own come back afterwards."""
    monkeypatch.setattr(ways_forward, "_checks", {})
    return ways_forward._checks


@pytest.fixture
def warnings(caplog):
    caplog.set_level(logging.INFO, logger="hubdommed.monitor")

    def stranded() -> list[logging.LogRecord]:
        return [
            record
            for record in caplog.records
            if record.name == "hubdommed.monitor" and record.getMessage().startswith("stranded")
        ]

    return stranded


def repaired(machine: str) -> float:
    return sample("hubdommed_stranded_rows_total", machine=machine)


def total(machine: str) -> float | None:
    return REGISTRY.get_sample_value("hubdommed_stranded_rows_total", {"machine": machine})


def unrepaired(machine: str) -> float | None:
    return REGISTRY.get_sample_value("hubdommed_stranded_rows_unrepaired", {"machine": machine})


def test_each_repaired_row_is_counted_by_machine_and_logged_once_with_what_was_done(
    monitor, checks, warnings
):
    found = {
        "test_a": [Repaired("row a1", "stuck", "moved"), Repaired("row a2", "stuck", "moved")],
        "test_b": [Repaired("row b1", "lost", "re-sent")],
    }
    register_stranded_check("test_a", lambda: found["test_a"])
    register_stranded_check("test_b", lambda: found["test_b"])
    before = {machine: repaired(machine) for machine in found}

    counts = monitor.run_cycle()

    assert counts.stranded.repaired == {"test_a": 2, "test_b": 1}
    assert {machine: repaired(machine) - before[machine] for machine in found} == {
        "test_a": 2,
        "test_b": 1,
    }
    records = warnings()
    assert [(r.levelno, r.machine, r.row, r.problem, r.action) for r in records] == [
        (logging.WARNING, "test_a", "row a1", "stuck", "moved"),
        (logging.WARNING, "test_a", "row a2", "stuck", "moved"),
        (logging.WARNING, "test_b", "row b1", "lost", "re-sent"),
    ]
    assert "stranded rows: 3 repaired (test_a 2, test_b 1), 0 left to an operator" in (
        counts.line()
    )


def test_every_machine_has_its_series_from_the_first_cycle_even_with_nothing_found(monitor, checks):
    register_stranded_check("test_quiet", lambda: [])

    monitor.run_cycle()

    assert total("test_quiet") is not None  # present, so that a rate() over it is 0
    assert unrepaired("test_quiet") == 0


def test_the_apps_register_a_check_for_each_of_their_state_machines():
    assert {"jobs", "task_runs", "outbox_messages", "platform_outbox_messages"} <= set(
        stranded_checks()
    )


def test_a_row_a_check_cannot_move_is_logged_once_while_it_stays_stranded_and_shown_in_a_gauge(
    monitor, checks, warnings
):
    stuck = [Repaired("row 1", "refused by the broker", "fix the broker", repaired=False)]
    register_stranded_check("test_stuck", lambda: list(stuck))
    before = repaired("test_stuck")

    for _ in range(3):
        counts = monitor.run_cycle()
        assert counts.stranded.unrepaired == {"test_stuck": 1}
        assert unrepaired("test_stuck") == 1

    assert len(warnings()) == 1
    assert warnings()[0].repaired is False
    assert "left to an operator" in warnings()[0].getMessage()
    assert repaired("test_stuck") == before  # nothing was repaired
    assert "0 repaired, 1 left to an operator" in counts.line()

    # Moved by an operator: no longer found, and the gauge says so.
    stuck.clear()
    monitor.run_cycle()
    assert unrepaired("test_stuck") == 0
    # Stranded again later: a new occurrence, logged again.
    stuck.append(Repaired("row 1", "refused by the broker", "fix the broker", repaired=False))
    monitor.run_cycle()
    assert len(warnings()) == 2


def test_a_failing_check_does_not_keep_the_others_from_running(monitor, checks, warnings):
    def broken():
        raise RuntimeError("the check broke")

    register_stranded_check("test_broken", broken)
    register_stranded_check("test_after", lambda: [Repaired("row 9", "stuck", "moved")])
    errors = sample("hubdommed_monitor_step_errors_total", step="repair_stranded_rows.test_broken")

    counts = monitor.run_cycle()

    assert counts.stranded.failed == ["test_broken"]
    assert counts.stranded.repaired == {"test_after": 1}
    assert [r.row for r in warnings()] == ["row 9"]
    assert (
        sample("hubdommed_monitor_step_errors_total", step="repair_stranded_rows.test_broken")
        == errors + 1
    )
    assert "checks failed: test_broken" in counts.line()
    assert counts.errors == 1


def test_the_database_away_stops_the_checks_after_it_and_keeps_what_those_before_repaired(
    monitor, checks, warnings, caplog
):
    ran = []

    def away():
        ran.append("test_away")
        raise OperationalError("server closed the connection unexpectedly")

    def after():
        ran.append("test_later")
        return []

    register_stranded_check("test_first", lambda: [Repaired("row 1", "stuck", "moved")])
    register_stranded_check("test_away", away)
    register_stranded_check("test_later", after)
    errors = sample("hubdommed_monitor_step_errors_total", step="repair_stranded_rows")
    before = repaired("test_first")

    counts = monitor.run_cycle()

    assert ran == ["test_away"]
    assert repaired("test_first") == before + 1
    assert counts.stranded.failed == ["test_away"]
    assert sample("hubdommed_monitor_step_errors_total", step="repair_stranded_rows") == errors + 1
    away_lines = [
        r for r in caplog.records if "repair_stranded_rows: database unreachable" in r.getMessage()
    ]
    assert len(away_lines) == 1  # one line for the step
    # No traceback anywhere: not the step's, nor that of the cycle's end record, which
    # meets the connection the step dropped (a test's, not replaced inside its transaction).
    assert [r.getMessage() for r in caplog.records if r.exc_info] == []
