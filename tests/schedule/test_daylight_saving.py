"""Daylight-saving changes follow the schedule's zone: a missing time runs once, at the next
valid minute; a repeated one runs once. The firing is walked minute by minute across the
change, as the scheduler would (every few seconds), with the clock moved by time-machine."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
import time_machine

from schedule.firing import schedules_fire_due
from tests.schedule.support import due_times_of, new_schedule, utc

pytestmark = pytest.mark.django_db


def fire_every_minute(start: datetime, end: datetime) -> None:
    moment = start
    while moment <= end:
        with time_machine.travel(moment + timedelta(seconds=3), tick=False):
            schedules_fire_due()
        moment += timedelta(minutes=1)


def local(moment: datetime, zone: str) -> str:
    return moment.astimezone(ZoneInfo(zone)).isoformat()


def test_new_york_a_0230_that_does_not_exist_runs_once_at_0300(tenant, automation):
    zone = "America/New_York"
    with time_machine.travel(utc(2026, 3, 7, 12), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="30 2 * * *", timezone_name=zone
        )

    # 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00 UTC).
    fire_every_minute(utc(2026, 3, 8, 6, 0), utc(2026, 3, 8, 8, 30))

    assert [local(due, zone) for due in due_times_of(schedule)] == ["2026-03-08T03:00:00-04:00"]
    schedule.refresh_from_db()
    assert local(schedule.next_run_at, zone) == "2026-03-09T02:30:00-04:00"


def test_new_york_a_0130_that_happens_twice_runs_once(tenant, automation):
    zone = "America/New_York"
    with time_machine.travel(utc(2026, 10, 31, 12), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="30 1 * * *", timezone_name=zone
        )

    # 2026-11-01: 02:00 EDT becomes 01:00 EST (06:00 UTC); 01:30 comes at 05:30 and 06:30 UTC.
    fire_every_minute(utc(2026, 11, 1, 5, 0), utc(2026, 11, 1, 7, 0))

    assert [local(due, zone) for due in due_times_of(schedule)] == ["2026-11-01T01:30:00-04:00"]
    schedule.refresh_from_db()
    assert local(schedule.next_run_at, zone) == "2026-11-02T01:30:00-05:00"


def test_sao_paulo_a_midnight_run_on_the_day_daylight_saving_began_runs_once_at_0100(
    tenant, automation
):
    zone = "America/Sao_Paulo"
    with time_machine.travel(utc(2018, 11, 3, 12), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="30 0 * * *", timezone_name=zone
        )

    # 2018-11-04: 00:00 -03 became 01:00 -02 (03:00 UTC); 00:30 did not exist.
    fire_every_minute(utc(2018, 11, 4, 2, 0), utc(2018, 11, 4, 4, 0))

    assert [local(due, zone) for due in due_times_of(schedule)] == ["2018-11-04T01:00:00-02:00"]


def test_sao_paulo_a_2330_that_happened_twice_when_daylight_saving_ended_runs_once(
    tenant, automation
):
    zone = "America/Sao_Paulo"
    with time_machine.travel(utc(2019, 2, 16, 12), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="30 23 * * *", timezone_name=zone
        )

    # 2019-02-17: 00:00 -02 went back to 23:00 -03 (02:00 UTC); 23:30 came at 01:30 and 02:30.
    fire_every_minute(utc(2019, 2, 17, 1, 0), utc(2019, 2, 17, 3, 0))

    assert [local(due, zone) for due in due_times_of(schedule)] == ["2019-02-16T23:30:00-02:00"]
    schedule.refresh_from_db()
    assert local(schedule.next_run_at, zone) == "2019-02-17T23:30:00-03:00"


def test_an_every_15_minutes_schedule_follows_the_time_that_passes_across_the_gap(
    tenant, automation
):
    zone = "America/New_York"
    with time_machine.travel(utc(2026, 3, 8, 6, 20), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="*/15 * * * *", timezone_name=zone
        )

    fire_every_minute(utc(2026, 3, 8, 6, 25), utc(2026, 3, 8, 7, 20))

    # 01:30, 01:45 EST, then 03:00 EDT: fifteen minutes apart, as the clock on the wall says.
    assert [local(due, zone) for due in due_times_of(schedule)] == [
        "2026-03-08T01:30:00-05:00",
        "2026-03-08T01:45:00-05:00",
        "2026-03-08T03:00:00-04:00",
        "2026-03-08T03:15:00-04:00",
    ]
