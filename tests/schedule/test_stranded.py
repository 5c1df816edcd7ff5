"""The ways-forward check of schedules: rows no scheduler would move get their way back."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine

from common.ways_forward import stranded_checks
from schedule.firing import schedules_fire_due
from schedule.models import Schedule
from schedule.services import schedule_pause
from schedule.stranded import overdue_after, schedules_stranded
from tests.factories import AutomationFactory
from tests.schedule.support import due_times_of, new_schedule, other_connection, utc

pytestmark = pytest.mark.django_db

NOW = utc(2026, 6, 1, 12, 0, 30)


def test_the_check_is_registered_for_the_monitor():
    assert stranded_checks()["schedules"] is schedules_stranded


def test_an_active_schedule_with_no_next_run_gets_its_next_due_time(tenant, automation):
    with time_machine.travel(NOW - timedelta(days=1), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=None)

    with time_machine.travel(NOW, tick=False):
        (repaired,) = schedules_stranded()
        again = schedules_stranded()

    assert repaired.row == f"schedule {schedule.pk}"
    assert repaired.problem == "active with no next run"
    assert repaired.action == "next run set to 2026-06-02T06:00:00+00:00"
    assert again == []
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 2, 6)


@pytest.mark.parametrize(
    ("cron", "zone", "why"),
    [
        ("61 * * * *", "UTC", "out of range"),
        ("*/15 2 8-14 3 */7", "America/New_York", "no due time"),
        ("0 6 * * *", "localtime", "not an IANA time zone"),
    ],
)
def test_one_whose_calendar_has_no_due_time_is_paused_with_the_reason(
    tenant, automation, cron, zone, why
):
    schedule = new_schedule(tenant=tenant, automation=automation)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=None, cron=cron, timezone=zone)

    (repaired,) = schedules_stranded()

    assert repaired.action.startswith("paused: Its calendar cannot be read")
    schedule.refresh_from_db()
    assert schedule.status == "paused" and why in schedule.paused_reason


def test_paused_and_deactivated_schedules_are_not_stranded(tenant, automation, manager_api):
    paused = new_schedule(tenant=tenant, automation=automation)
    schedule_pause(tenant=tenant, schedule_id=paused.pk)
    ended = new_schedule(tenant=tenant, automation=automation)
    manager_api.post(f"/api/v1/schedules/{ended.pk}/deactivate")

    assert schedules_stranded() == []


def _passed_over(tenant, automation):
    """A schedule due an hour ago, and another one a scheduler fired since."""
    with time_machine.travel(NOW - timedelta(hours=2), tick=False):
        late = new_schedule(tenant=tenant, automation=automation, cron="0 * * * *", name="late")
        fired = new_schedule(tenant=tenant, automation=AutomationFactory(), cron="* * * * *")
    Schedule.objects.filter(pk=late.pk).update(next_run_at=NOW - timedelta(hours=1))
    return late, fired


def test_a_schedule_the_running_scheduler_passed_over_is_fired(tenant, automation):
    late, fired = _passed_over(tenant, automation)
    with time_machine.travel(NOW, tick=False):
        schedules_fire_due(now=NOW, batch_size=1)  # a scheduler at work: it took `fired`
    assert due_times_of(fired)
    assert NOW - late.next_run_at > overdue_after()

    with time_machine.travel(NOW, tick=False):
        repaired = schedules_stranded()

    assert [r.row for r in repaired] == [f"schedule {late.pk}"]
    assert repaired[0].action == "fired: 1 runs started, next run at 2026-06-01T13:00:00+00:00"
    # run_once: the latest of the missed hours.
    assert due_times_of(late) == [utc(2026, 6, 1, 12)]


def test_when_no_scheduler_runs_late_schedules_are_left_to_it(tenant, automation):
    late, _ = _passed_over(tenant, automation)

    with time_machine.travel(NOW, tick=False):
        assert schedules_stranded() == []

    assert due_times_of(late) == []


@pytest.mark.django_db(transaction=True)
def test_a_row_another_transaction_holds_is_left_alone(tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=None)
    with other_connection() as holder:
        holder.execute("SELECT id FROM schedules WHERE id = %s FOR UPDATE", [schedule.pk])
        held = schedules_stranded()
    released = schedules_stranded()

    assert held == []
    assert [r.row for r in released] == [f"schedule {schedule.pk}"]
