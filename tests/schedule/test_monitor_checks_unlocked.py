"""The monitor's schedule check fires a passed-over schedule as the scheduler would: its
parameters are checked against the automation's schema (a tenant's input, up to
``JOB_PARAMS_VALIDATION_SECONDS`` of work) before the schedule's row is locked, never under
the lock. So is any firing of a plan nobody checked: it is checked before the lock."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from schedule.firing import plan_of, schedules_fire_due, schedules_fire_planned
from schedule.models import Schedule
from schedule.stranded import schedules_stranded
from tests.factories import AutomationFactory
from tests.schedule.support import due_times_of, jobs_of, new_schedule, probe_row_locks, utc

pytestmark = pytest.mark.django_db(transaction=True)

NOW = utc(2026, 6, 1, 12, 0, 30)


@pytest.fixture
def row_lock_probe(monkeypatch):
    """What each parameter check found of the probed schedules' rows (none until the test
    names them): free or locked."""
    probed: list[int] = []
    return probe_row_locks(monkeypatch, probed), probed


def test_the_monitor_checks_a_passed_over_schedules_parameters_before_it_locks_it(
    row_lock_probe, tenant, automation
):
    found, probed = row_lock_probe
    with time_machine.travel(NOW - timedelta(hours=2), tick=False):
        late = new_schedule(tenant=tenant, automation=automation, cron="0 * * * *", name="late")
        fired = new_schedule(tenant=tenant, automation=AutomationFactory(), cron="* * * * *")
    Schedule.objects.filter(pk=late.pk).update(next_run_at=NOW - timedelta(hours=1))
    with time_machine.travel(NOW, tick=False):
        schedules_fire_due(now=NOW, batch_size=1)  # a scheduler at work: it took `fired`
    assert due_times_of(fired)
    probed.append(late.pk)
    found.clear()

    with time_machine.travel(NOW, tick=False):
        (repaired,) = schedules_stranded()

    assert repaired.action == "fired: 1 runs started, next run at 2026-06-01T13:00:00+00:00"
    assert due_times_of(late) == [utc(2026, 6, 1, 12)]
    # Checked once, and while nobody held the row.
    assert found == ["free"]


def test_a_plan_nobody_checked_is_checked_before_its_row_is_locked(
    row_lock_probe, tenant, automation
):
    found, probed = row_lock_probe
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation)
    probed.append(schedule.pk)
    found.clear()
    now = utc(2026, 6, 1, 6, 0, 3)

    # A plan made without ``schedules_plan_due``'s check (as the monitor's was).
    firing = schedules_fire_planned([plan_of(schedule, now=now)], now=now)

    assert len(firing.started) == 1 and not firing.failed
    assert len(jobs_of(schedule)) == 1
    assert found == ["free"]


def test_parameters_the_schema_refuses_pause_a_passed_over_schedule_unlocked(
    row_lock_probe, tenant, automation
):
    found, probed = row_lock_probe
    with time_machine.travel(NOW - timedelta(hours=2), tick=False):
        late = new_schedule(tenant=tenant, automation=automation, cron="0 * * * *", name="late")
        new_schedule(tenant=tenant, automation=AutomationFactory(), cron="* * * * *")
    Schedule.objects.filter(pk=late.pk).update(
        next_run_at=NOW - timedelta(hours=1), params={"name": 7}
    )
    with time_machine.travel(NOW, tick=False):
        schedules_fire_due(now=NOW, batch_size=1)
    probed.append(late.pk)
    found.clear()

    with time_machine.travel(NOW, tick=False):
        (repaired,) = schedules_stranded()

    late.refresh_from_db()
    assert late.is_paused and "invalid_params" in late.paused_reason
    assert repaired.action.startswith("fired: now paused: The run was refused (invalid_params)")
    assert not jobs_of(late)
    assert found == ["free"]
