"""The firing: one job per due time, whoever fires and whatever the clock did."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import psycopg
import pytest
import time_machine
from django.db import connection

from automation.models import Automation
from identity.models import Tenant
from job.models import Job
from schedule.firing import schedules_fire_due
from schedule.models import Schedule, ScheduleRun
from schedule.services import schedule_pause, schedule_resume
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import due_times_of, jobs_of, new_schedule, other_connection, utc

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


def test_a_long_outage_of_an_every_minute_schedule_starts_the_minutes_within_the_grace(
    tenant, automation, settings
):
    settings.SCHEDULE_MISFIRE_GRACE_SECONDS = 300
    with time_machine.travel(utc(2026, 6, 1, 9, 30, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")

    schedules_fire_due(now=utc(2026, 6, 9, 9, 30, 30))

    # At most 300 s late: 09:26 to 09:30, each once. The week before was missed, and as runs
    # within the grace start, run_once adds no late one.
    assert due_times_of(schedule) == [utc(2026, 6, 9, 9, minute) for minute in range(26, 31)]


def test_schedulers_away_for_150_seconds_start_each_minute_they_missed(
    tenant, automation, settings
):
    settings.SCHEDULE_MISFIRE_GRACE_SECONDS = 300
    with time_machine.travel(utc(2026, 6, 1, 9, 0, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")
    schedules_fire_due(now=utc(2026, 6, 1, 9, 1, 3))

    # Away from 09:01:03 to 09:03:33: 09:02 and 09:03 are due, both within the grace.
    firing = schedules_fire_due(now=utc(2026, 6, 1, 9, 3, 33))

    assert len(firing.started) == 2
    assert due_times_of(schedule) == [utc(2026, 6, 1, 9, minute) for minute in (1, 2, 3)]
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2026, 6, 1, 9, 4)
    assert schedule.last_run_at == utc(2026, 6, 1, 9, 3)


def test_skip_starts_the_runs_within_the_grace_and_none_before(tenant, automation, settings):
    settings.SCHEDULE_MISFIRE_GRACE_SECONDS = 300
    with time_machine.travel(utc(2026, 6, 1, 9, 0, 30), tick=False):
        schedule = new_schedule(
            tenant=tenant, automation=automation, cron="*/2 * * * *", misfire="skip"
        )

    schedules_fire_due(now=utc(2026, 6, 1, 9, 20, 0))

    assert due_times_of(schedule) == [utc(2026, 6, 1, 9, minute) for minute in (16, 18, 20)]


# --- calendars that are slow, stuck or empty --------------------------------------------------


@pytest.mark.timeout(30)
def test_chatham_across_its_repeated_hour_fires_and_moves_on(tenant, automation):
    # Pacific/Chatham: 03:45 +13:45 becomes 02:45 +12:45 on 2027-04-04 (13:45:30Z is 03:30:30).
    with time_machine.travel(utc(2027, 4, 3, 13, 40), tick=False):
        schedule = new_schedule(
            tenant=tenant,
            automation=automation,
            cron="*/15 3 * * *",
            timezone_name="Pacific/Chatham",
        )
    assert schedule.next_run_at == utc(2027, 4, 3, 13, 45)

    schedules_fire_due(now=utc(2027, 4, 3, 13, 45, 30))

    assert due_times_of(schedule) == [utc(2027, 4, 3, 13, 45)]
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2027, 4, 3, 14, 15)  # 03:00 +12:45


def test_a_calendar_left_without_a_due_time_pauses_its_schedule_with_the_reason(tenant, automation):
    schedule = _hourly(tenant, automation)
    # Hour 2 of the second Sunday of March never exists in New York: no due time, ever.
    Schedule.objects.filter(pk=schedule.pk).update(
        cron="*/15 2 8-14 3 */7", timezone="America/New_York"
    )

    firing = schedules_fire_due(now=utc(2026, 6, 1, 10, 0, 5))

    assert firing.stopped == [schedule.pk] and jobs_of(schedule) == []
    schedule.refresh_from_db()
    assert schedule.status == "paused" and schedule.next_run_at is None
    assert "no due time within 50 years" in schedule.paused_reason


class _LockProbe(logging.Handler):
    """While the firing computes a schedule's due times, try to lock the due rows from
    another connection, without waiting: a firing that computes under its locks fails it."""

    def __init__(self, ids: list[int]) -> None:
        super().__init__(level=logging.DEBUG)
        self.ids = ids
        self.outcomes: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "computing its due times" not in record.getMessage():
            return
        with other_connection() as probe:
            try:
                probe.execute(
                    "SELECT id FROM schedules WHERE id = ANY(%s) FOR UPDATE NOWAIT", [self.ids]
                )
                self.outcomes.append("locked")
            except psycopg.errors.LockNotAvailable:
                self.outcomes.append("held by the firing")
            probe.rollback()


@pytest.mark.django_db(transaction=True)
def test_the_firing_holds_no_lock_while_it_computes_due_times(tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedules = [
            new_schedule(tenant=tenant, automation=automation, name=f"s{n}") for n in range(3)
        ]
    probe = _LockProbe([schedule.pk for schedule in schedules])
    log = logging.getLogger("hubdommed.schedule")
    level = log.level
    log.addHandler(probe)
    log.setLevel(logging.DEBUG)
    try:
        firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))
    finally:
        log.removeHandler(probe)
        log.setLevel(level)

    assert probe.outcomes == ["locked"] * 3
    assert len(firing.started) == 3


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


def test_a_schedule_whose_firing_fails_moves_on_and_its_batch_goes_on(tenant, automation):
    other = AutomationFactory()
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        failing = new_schedule(tenant=tenant, automation=automation, name="failing")
        healthy = new_schedule(tenant=tenant, automation=other, name="healthy")
    # The database itself refuses this automation's jobs (a trigger of this test's own).
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse_test_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.automation_id = %s THEN RAISE EXCEPTION 'jobs refused by the test'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_test_jobs BEFORE INSERT ON jobs
                FOR EACH ROW EXECUTE FUNCTION refuse_test_jobs();
            """,
            [automation.pk],
        )

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert jobs_of(failing) == [] and len(jobs_of(healthy)) == 1
    assert firing.started == [jobs_of(healthy)[0].pk] and firing.failed == [failing.pk]
    assert not ScheduleRun.objects.filter(schedule=failing).exists()
    failing.refresh_from_db()
    # Still active: the next due time is awaited, and a fixed database runs it.
    assert failing.status == "active" and failing.next_run_at == utc(2026, 6, 2, 6)
    assert schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 8)).failed == []
