"""A person's change that lands between a firing's plan and its apply: the stale plan starts
nothing, and each due time still starts at most one job, the next cycle doing what the
change asked."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from schedule.firing import (
    ParamsChecks,
    schedules_fire_due,
    schedules_fire_planned,
    schedules_plan_due,
)
from schedule.models import Schedule, ScheduleRun
from schedule.services import schedule_deactivate, schedule_pause, schedule_update
from tests.schedule.support import due_times_of, new_schedule, utc

pytestmark = pytest.mark.django_db

DUE = utc(2026, 6, 1, 6, 0)
NOW = DUE + timedelta(seconds=2)


@pytest.fixture
def due_schedule(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        return new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")


def planned():
    checks = ParamsChecks()
    plans = schedules_plan_due(now=NOW, checks=checks)
    assert [plan.starts for plan in plans] == [(DUE,)]
    return plans, checks


def test_a_new_cron_between_plan_and_fire_takes_effect_from_now(tenant, due_schedule):
    plans, checks = planned()
    with time_machine.travel(NOW + timedelta(seconds=1), tick=False):
        schedule_update(tenant=tenant, schedule_id=due_schedule.pk, data={"cron": "0 7 * * *"})

    assert schedules_fire_planned(plans, now=NOW, checks=checks).started == []
    assert schedules_fire_due(now=NOW + timedelta(seconds=3)).started == []
    with time_machine.travel(utc(2026, 6, 1, 7, 0, 1), tick=False):
        schedules_fire_due()
    assert due_times_of(due_schedule) == [utc(2026, 6, 1, 7, 0)]


@pytest.mark.parametrize("stop", [schedule_pause, schedule_deactivate])
def test_a_pause_or_deactivation_between_plan_and_fire_starts_nothing(tenant, due_schedule, stop):
    plans, checks = planned()
    stop(tenant=tenant, schedule_id=due_schedule.pk)

    assert schedules_fire_planned(plans, now=NOW, checks=checks).started == []
    assert schedules_fire_due(now=NOW + timedelta(days=2)).started == []
    assert not ScheduleRun.objects.exists()
    due_schedule.refresh_from_db()
    assert due_schedule.next_run_at is None and due_schedule.status != "active"


@pytest.mark.parametrize(
    "change", [{"misfire": "skip"}, {"params": {"name": "Grace"}}, {"name": "renamed"}]
)
def test_a_change_that_keeps_the_calendar_still_starts_the_due_time_once(
    tenant, due_schedule, change
):
    plans, checks = planned()
    schedule_update(tenant=tenant, schedule_id=due_schedule.pk, data=change)

    schedules_fire_planned(plans, now=NOW, checks=checks)
    schedules_fire_due(now=NOW + timedelta(seconds=3))
    schedules_fire_planned(plans, now=NOW, checks=checks)  # the old plan, again

    assert due_times_of(due_schedule) == [DUE]
    assert Schedule.objects.get().next_run_at == DUE + timedelta(days=1)
