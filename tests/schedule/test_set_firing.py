"""A batch of due schedules fires as a set: a few statements for the batch, not per schedule."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import time_machine
from django.db import connection
from django.test.utils import CaptureQueriesContext

from job.models import Job
from outbox.models import Event, OutboxMessage, TaskRun
from schedule.firing import schedules_fire_due, schedules_fire_planned, schedules_plan_due
from schedule.models import Schedule, ScheduleRun
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import jobs_of, new_schedule, other_connection, utc

pytestmark = pytest.mark.django_db


def _due_at_six(count: int, *, tenants: int = 2, automations: int = 2) -> list[Schedule]:
    owners = [TenantFactory() for _ in range(tenants)]
    kinds = [AutomationFactory() for _ in range(automations)]
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        return [
            new_schedule(
                tenant=owners[n % tenants],
                automation=kinds[n % automations],
                name=f"s{n}",
                params={"n": n},
            )
            for n in range(count)
        ]


def _statements_of_one_batch(count: int) -> list[str]:
    _due_at_six(count)
    with CaptureQueriesContext(connection) as queries:
        firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3), batch_size=count)
    assert len(firing.started) == count and not firing.failed
    # The webhook deliveries' listener reads the endpoints of each event's tenant (one read
    # per event, its own): what is counted here is the firing's writes and reads.
    return [q["sql"] for q in queries.captured_queries if '"webhook_endpoints"' not in q["sql"]]


def test_a_batch_of_due_schedules_fires_in_as_many_statements_whatever_its_size():
    small = _statements_of_one_batch(3)
    ScheduleRun.objects.all().delete()
    large = _statements_of_one_batch(60)

    assert len(large) == len(small), "\n".join(large)
    assert len(large) <= 20, "\n".join(large)


def test_the_set_writes_every_job_its_event_its_runs_and_its_outbox_rows():
    schedules = _due_at_six(12)

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    jobs = Job.objects.filter(pk__in=firing.started)
    assert jobs.count() == 12
    for schedule in schedules:
        (job,) = jobs_of(schedule)
        assert job.triggered_by == {"schedule": schedule.pk, "due_at": "2026-06-01T06:00:00+00:00"}
        assert job.params == schedule.params and job.tenant_id == schedule.tenant_id
        assert ScheduleRun.objects.get(schedule=schedule).job_id == job.pk
        schedule.refresh_from_db()
        assert schedule.last_run_at == utc(2026, 6, 1, 6) and schedule.next_run_at == utc(
            2026, 6, 2, 6
        )
    events = Event.objects.filter(type="JobCreated", aggregate_type="Job")
    assert sorted(int(e.aggregate_id) for e in events) == sorted(firing.started)
    for event in events:
        assert event.payload["job_id"] == int(event.aggregate_id)
        # One outbox row per subscriber of JobCreated, each naming its event.
        messages = OutboxMessage.objects.filter(envelope__event_id=event.pk)
        assert {m.envelope["task"] for m in messages} == {
            "machines.power_on",
            "worker.job_available",
        }
        assert all(m.tenant_id == event.tenant_id for m in messages)
    # worker.job_available goes to the automation's own worker: no task run of its own.
    assert TaskRun.objects.filter(event="JobCreated").count() == 12


def test_a_due_time_already_started_is_skipped_and_the_rest_of_the_set_fires():
    schedules = _due_at_six(4)
    schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))
    # Moved back by hand: 06:00 is due again for two of them, and a new time for the others.
    Schedule.objects.filter(pk__in=[s.pk for s in schedules[:2]]).update(
        next_run_at=utc(2026, 6, 1, 6)
    )

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 30))

    assert firing.started == [] and firing.failed == []
    assert [len(jobs_of(s)) for s in schedules] == [1, 1, 1, 1]
    for schedule in schedules[:2]:
        schedule.refresh_from_db()
        assert schedule.next_run_at == utc(2026, 6, 2, 6)


@pytest.mark.django_db(transaction=True)
def test_four_firings_racing_over_many_due_schedules_start_each_due_time_once():
    schedules = _due_at_six(120, tenants=3, automations=3)
    errors: list[BaseException] = []
    start_line = threading.Barrier(4)

    def fire() -> None:
        try:
            start_line.wait(timeout=30)
            while schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3), batch_size=25).more:
                pass
        except BaseException as exc:  # reported below, with the thread's error
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=fire) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)

    assert not errors and not any(thread.is_alive() for thread in threads)
    runs = Counter(
        (job.triggered_by["schedule"], job.triggered_by["due_at"]) for job in Job.objects.all()
    )
    assert set(schedule for schedule, _ in runs) == {s.pk for s in schedules}
    assert max(runs.values()) == 1 and ScheduleRun.objects.count() == 120


def test_a_set_the_outbox_refuses_is_undone_and_fires_again_one_by_one():
    first, second = _due_at_six(2, tenants=2, automations=1)
    # The database refuses the outbox rows of the first schedule's tenant (a trigger of this
    # test's own): the set's one statement for events, runs and outbox rows fails.
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse_test_messages() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF NEW.tenant_id = %s THEN RAISE EXCEPTION 'messages refused by the test'; END IF;
                RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_test_messages BEFORE INSERT ON outbox_messages
                FOR EACH ROW EXECUTE FUNCTION refuse_test_messages();
            """,
            [first.tenant_id],
        )

    with CaptureQueriesContext(connection) as queries:
        firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert any("ROLLBACK TO SAVEPOINT" in q["sql"] for q in queries.captured_queries)
    assert firing.failed == [first.pk] and jobs_of(first) == []
    (job,) = jobs_of(second)
    assert firing.started == [job.pk]
    # Nothing of the undone set is left: one job, its event and its outbox rows.
    assert Job.objects.count() == 1 and ScheduleRun.objects.count() == 1
    assert list(Event.objects.values_list("aggregate_id", flat=True)) == [str(job.pk)]
    assert OutboxMessage.objects.filter(tenant_id=first.tenant_id).count() == 0
    assert OutboxMessage.objects.filter(envelope__payload__job_id=job.pk).count() == 2
    first.refresh_from_db()
    assert first.status == "active" and first.next_run_at == utc(2026, 6, 2, 6)


@pytest.mark.django_db(transaction=True)
def test_a_firing_plans_past_the_rows_another_firing_holds_and_says_more_may_be_due():
    schedules = sorted(_due_at_six(6), key=lambda schedule: schedule.pk)
    now = utc(2026, 6, 1, 6, 0, 3)
    first, rest = [s.pk for s in schedules[:3]], {s.pk for s in schedules[3:]}
    other = other_connection()
    try:
        # Another firing writing the first three (it holds their rows until it commits).
        other.execute("SELECT id FROM schedules WHERE id = ANY(%s) FOR UPDATE", [first])

        firing = schedules_fire_due(now=now, batch_size=3)

        assert {job.triggered_by["schedule"] for job in Job.objects.all()} == rest
        assert firing.more and firing.held == []
        # Planned before the other firing took them, held when it came to lock them: the
        # batch is the other's, and this firing says more may be due beyond it.
        other.rollback()
        plans = schedules_plan_due(now=now, batch_size=3)
        other.execute("SELECT id FROM schedules WHERE id = ANY(%s) FOR UPDATE", [first])
        late = schedules_fire_planned(plans, now=now)
        assert late.started == [] and sorted(late.held) == first
    finally:
        other.close()
    assert Job.objects.count() == 3
