"""A schedule's parameters are checked against its automation's schema (a tenant's input,
and up to ``JOB_PARAMS_VALIDATION_SECONDS`` of work) while no schedule row is locked: the
firing checks them when it plans, resuming checks them before it locks."""

from __future__ import annotations

import pytest
import time_machine

from schedule import firing as schedule_firing
from schedule.firing import schedules_fire_due
from schedule.models import Schedule
from schedule.services import schedule_pause, schedule_resume
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import jobs_of, new_schedule, probe_row_locks, utc

pytestmark = pytest.mark.django_db(transaction=True)

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}}


@pytest.fixture
def lock_probe(monkeypatch):
    """What each parameter check found of the schedules' rows: free or locked."""
    return probe_row_locks(monkeypatch)


def due_schedules(count: int = 3, *, params=None) -> list[Schedule]:
    tenant = TenantFactory()
    automation = AutomationFactory(params_schema=SCHEMA)
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        return [
            new_schedule(
                tenant=tenant,
                automation=automation,
                name=f"s{n}",
                params=params if params is not None else {"n": n},
            )
            for n in range(count)
        ]


def test_the_firing_checks_parameters_before_it_locks_a_schedule(lock_probe):
    schedules = due_schedules()
    lock_probe.clear()

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert len(firing.started) == 3 and not firing.failed
    assert lock_probe == ["free"] * 3
    assert all(len(jobs_of(schedule)) == 1 for schedule in schedules)


def test_fired_one_by_one_the_schedules_are_not_checked_under_their_lock(lock_probe, monkeypatch):
    schedules = due_schedules()
    lock_probe.clear()

    def refused(*args, **kwargs):
        raise ValueError("a row of the set refused")

    monkeypatch.setattr(schedule_firing, "_fire_set", refused)

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert len(firing.started) == 3 and not firing.failed
    assert lock_probe and "locked" not in lock_probe
    assert all(len(jobs_of(schedule)) == 1 for schedule in schedules)


def test_parameters_the_schema_refuses_pause_the_schedule_with_the_reason(lock_probe):
    (schedule,) = due_schedules(1)
    Schedule.objects.filter(pk=schedule.pk).update(params={"n": "not a number"})
    lock_probe.clear()

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert firing.stopped == [schedule.pk] and not firing.started
    schedule.refresh_from_db()
    assert schedule.is_paused
    assert "invalid_params" in schedule.paused_reason
    assert lock_probe == ["free"]


def test_parameters_changed_after_the_plan_are_left_to_the_next_cycle(monkeypatch):
    (schedule,) = due_schedules(1)
    plan = schedule_firing.schedules_plan_due

    def changed_meanwhile(**kwargs):
        plans = plan(**kwargs)
        Schedule.objects.filter(pk=schedule.pk).update(params={"n": "not a number"})
        return plans

    monkeypatch.setattr(schedule_firing, "schedules_plan_due", changed_meanwhile)
    first = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))
    monkeypatch.setattr(schedule_firing, "schedules_plan_due", plan)
    second = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 4))

    # Not started on the plan's verdict for other parameters: planned again, refused.
    assert not first.started and not first.applied
    assert second.stopped == [schedule.pk] and not jobs_of(schedule)


def test_resuming_checks_parameters_before_it_locks_the_schedule(lock_probe):
    (schedule,) = due_schedules(1)
    schedule_pause(tenant=schedule.tenant, schedule_id=schedule.pk)
    lock_probe.clear()

    resumed = schedule_resume(tenant=schedule.tenant, schedule_id=schedule.pk)

    assert not resumed.is_paused
    assert lock_probe == ["free"]
