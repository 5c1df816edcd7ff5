"""The firing: one job per due time, whoever fires and whatever the clock did."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection

from automation.models import Automation
from identity.models import Tenant
from job.models import Job
from schedule.models import Schedule, ScheduleRun
from schedule.services import schedule_pause, schedule_resume, schedules_fire_due
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import due_times_of, jobs_of, new_schedule, utc

pytestmark = pytest.mark.django_db


def test_a_due_schedule_starts_one_job_that_names_the_schedule_and_the_due_time(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")
    assert schedule.next_run_at == utc(2026, 6, 1, 6, 0)

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    (job,) = jobs_of(schedule)
    assert firing.started == [job.pk]
    assert job.status == Job.Status.PENDING
    assert job.params == {"name": "Ada"} and job.tenant_id == tenant.pk
    assert job.requested_by_id is None
    assert job.triggered_by == {"schedule": schedule.pk, "due_at": "2026-06-01T06:00:00+00:00"}
    assert ScheduleRun.objects.get(schedule=schedule).job_id == job.pk
    schedule.refresh_from_db()
    assert schedule.last_run_at == utc(2026, 6, 1, 6, 0)
    assert schedule.next_run_at == utc(2026, 6, 2, 6, 0)


def test_a_schedule_not_yet_due_starts_nothing(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")

    assert schedules_fire_due(now=utc(2026, 6, 1, 5, 59, 59)).started == []
    assert jobs_of(schedule) == []


def test_firing_again_after_a_restart_starts_nothing_more(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")
    schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 1))

    for second in range(2, 60, 10):
        assert schedules_fire_due(now=utc(2026, 6, 1, 6, 0, second)).started == []
    assert len(jobs_of(schedule)) == 1


# --- two firings racing ---------------------------------------------------------------------


def _race(threads: int, *, now, batch_size: int) -> list[list[int]]:
    start = threading.Barrier(threads)
    started: list[list[int]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def fire(position: int) -> None:
        try:
            start.wait()
            while True:
                firing = schedules_fire_due(now=now, batch_size=batch_size)
                started[position].extend(firing.started)
                if not firing.more:
                    break
        except BaseException as exc:  # reported below, not lost in the thread
            errors.append(exc)
        finally:
            connection.close()

    workers = [threading.Thread(target=fire, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)
    assert errors == []
    return started


@pytest.mark.django_db(transaction=True)
def test_two_firings_racing_start_exactly_one_job_per_schedule_and_due_time(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 59, 30), tick=False):
        schedules = [
            new_schedule(tenant=tenant, automation=automation, name=f"s{n}", cron="* * * * *")
            for n in range(24)
        ]
    minutes = [utc(2026, 6, 1, 6, minute, 1) for minute in range(4)]

    per_thread = []
    for now in minutes:
        per_thread.append(_race(2, now=now, batch_size=5))

    for schedule in schedules:
        assert due_times_of(schedule) == [now.replace(second=0) for now in minutes]
    assert Job.objects.count() == len(schedules) * len(minutes)
    # No job was reported started by both firings.
    started = [job for rounds in per_thread for thread in rounds for job in thread]
    assert len(started) == len(set(started)) == Job.objects.count()


@pytest.mark.django_db(transaction=True)
def test_four_firings_racing_on_one_schedule_start_it_once(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 59, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")

    for minute in range(5):
        _race(4, now=utc(2026, 6, 1, 6, minute, 2), batch_size=1)

    assert due_times_of(schedule) == [utc(2026, 6, 1, 6, minute) for minute in range(5)]


# --- clock jumps ----------------------------------------------------------------------------


def test_a_clock_that_went_back_does_not_start_a_due_time_twice(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")
    with time_machine.travel(utc(2026, 6, 1, 6, 0, 5), tick=False):
        schedules_fire_due()
    # The clock jumps back 20 s: a pause and resume then puts 06:00 due again.
    with time_machine.travel(utc(2026, 6, 1, 5, 59, 45), tick=False):
        schedule_pause(tenant=tenant, schedule_id=schedule.pk)
        schedule_resume(tenant=tenant, schedule_id=schedule.pk)
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 1, 6, 0)

    with time_machine.travel(utc(2026, 6, 1, 6, 0, 10), tick=False):
        firing = schedules_fire_due()

    assert firing.started == []
    assert due_times_of(schedule) == [utc(2026, 6, 1, 6, 0)]
    schedule.refresh_from_db()
    assert schedule.status == "active"
    assert schedule.next_run_at == utc(2026, 6, 2, 6, 0)


def test_a_clock_that_jumped_ahead_starts_one_run_not_one_per_skipped_due_time(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 59), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="*/5 * * * *")

    schedules_fire_due(now=utc(2026, 6, 1, 9, 2))

    assert due_times_of(schedule) == [utc(2026, 6, 1, 9, 0)]
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 1, 9, 5)


# --- misfires: the hub was down -------------------------------------------------------------


def _hourly(tenant, automation, **fields) -> Schedule:
    with time_machine.travel(utc(2026, 6, 1, 9, 30), tick=False):
        return new_schedule(tenant=tenant, automation=automation, cron="0 * * * *", **fields)


def test_after_an_outage_run_once_starts_only_the_latest_missed_run(tenant, automation):
    schedule = _hourly(tenant, automation)
    schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))
    # Down from 10:01 to 13:20: the 11:00, 12:00 and 13:00 runs were missed.

    firing = schedules_fire_due(now=utc(2026, 6, 1, 13, 20))

    assert len(firing.started) == 1
    assert due_times_of(schedule) == [utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 13, 0)]
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 1, 14, 0)
    assert schedules_fire_due(now=utc(2026, 6, 1, 13, 21)).started == []


def test_after_an_outage_skip_starts_none_of_the_missed_runs_and_waits_for_the_next(
    tenant, automation
):
    schedule = _hourly(tenant, automation, misfire="skip")
    schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))

    assert schedules_fire_due(now=utc(2026, 6, 1, 13, 20)).started == []

    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 1, 14, 0)
    schedules_fire_due(now=utc(2026, 6, 1, 14, 0, 20))
    assert due_times_of(schedule) == [utc(2026, 6, 1, 10, 0), utc(2026, 6, 1, 14, 0)]


def test_skip_still_starts_a_run_that_is_late_within_the_grace(tenant, automation, settings):
    settings.SCHEDULE_MISFIRE_GRACE_SECONDS = 300
    schedule = _hourly(tenant, automation, misfire="skip")

    schedules_fire_due(now=utc(2026, 6, 1, 10, 4, 59))

    assert due_times_of(schedule) == [utc(2026, 6, 1, 10, 0)]


def test_a_long_outage_of_an_every_minute_schedule_starts_one_run(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 9, 30, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")

    schedules_fire_due(now=utc(2026, 6, 9, 9, 30, 30))

    assert due_times_of(schedule) == [utc(2026, 6, 9, 9, 30)]


# --- automation, tenant and params --------------------------------------------------------


def test_a_schedule_of_a_deactivated_automation_stops_without_a_job(tenant, automation):
    schedule = _hourly(tenant, automation)
    Automation.objects.filter(pk=automation.pk).update(is_active=False)

    firing = schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))

    assert firing.started == [] and firing.stopped == [schedule.pk]
    schedule.refresh_from_db()
    assert schedule.status == "deactivated" and schedule.next_run_at is None
    assert schedule.deactivated_reason == "Its automation was deactivated."
    assert jobs_of(schedule) == []


def test_a_schedule_of_a_deactivated_tenant_stops_without_a_job(automation):
    tenant = TenantFactory()
    schedule = _hourly(tenant, automation)
    Tenant.objects.filter(pk=tenant.pk).update(is_active=False)

    schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))

    schedule.refresh_from_db()
    assert schedule.status == "deactivated"
    assert schedule.deactivated_reason == "Its tenant was deactivated."
    assert jobs_of(schedule) == []


def test_params_the_changed_schema_refuses_pause_the_schedule_with_the_reason(tenant, automation):
    schedule = _hourly(tenant, automation)
    automation.params_schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "count": {"type": "integer"}},
        "required": ["name", "count"],
    }
    automation.save(update_fields=["params_schema"])

    firing = schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))

    assert firing.started == [] and firing.stopped == [schedule.pk]
    schedule.refresh_from_db()
    assert schedule.status == "paused" and schedule.next_run_at is None
    assert "invalid_params" in schedule.paused_reason and "count" in schedule.paused_reason
    assert jobs_of(schedule) == []
    # Nothing is left half-done: no job, no run row, no event.
    assert not ScheduleRun.objects.exists() and not Job.objects.exists()


def test_one_refused_schedule_does_not_keep_the_others_of_its_batch_from_running(tenant):
    strict = AutomationFactory(params_schema={"type": "object", "required": ["x"]})
    lenient = AutomationFactory()
    with time_machine.travel(utc(2026, 6, 1, 9, 30), tick=False):
        refused = new_schedule(tenant=tenant, automation=strict, params={"x": 1})
        runs = new_schedule(tenant=tenant, automation=lenient)
    Automation.objects.filter(pk=strict.pk).update(
        params_schema={"type": "object", "required": ["y"]}
    )

    schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 5) + timedelta(days=1))

    assert len(jobs_of(runs)) == 1 and jobs_of(refused) == []


@pytest.mark.parametrize(
    ("field", "value"), [("cron", "61 * * * *"), ("timezone", "Nowhere/Atlantis")]
)
def test_a_calendar_that_cannot_be_read_pauses_its_schedule_and_the_others_still_run(
    tenant, automation, field, value
):
    # Changed in the database behind the API's back (or a zone the tz database dropped).
    broken = _hourly(tenant, automation, name="broken")
    healthy = _hourly(tenant, automation, name="healthy")
    Schedule.objects.filter(pk=broken.pk).update(**{field: value})

    for minute in (0, 1):
        schedules_fire_due(now=utc(2026, 6, 1, 10, minute, 5))

    assert len(jobs_of(healthy)) == 1 and jobs_of(broken) == []
    broken.refresh_from_db()
    assert broken.status == "paused" and broken.next_run_at is None
    assert broken.paused_reason.startswith("Its calendar cannot be read")
