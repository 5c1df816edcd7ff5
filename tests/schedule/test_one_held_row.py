"""One automation's row kept locked by a session (a psql left in a transaction) costs the
scheduler that automation's schedules only: the batch it was in waits past the lock
timeout, then fires one schedule a transaction, and the others start their jobs."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from job.models import Job
from schedule.firing import schedules_fire_due
from schedule.models import Schedule
from tests.factories import AutomationWithWorkerFactory, TenantFactory
from tests.locks import another_session

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def due_at(automation, due) -> Schedule:
    schedule = Schedule.objects.create(
        tenant=TenantFactory(), automation=automation, name="due", cron="* * * * *"
    )
    # A save plans the next minute's.
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)
    return schedule


def test_a_kept_lock_on_one_automation_leaves_the_others_schedules_firing(caplog):
    held, free = AutomationWithWorkerFactory(), AutomationWithWorkerFactory()
    # This minute's time on the calendar, and the firings' clock a second past it: one
    # due time each, however long the test takes (a firing on the wall clock that crossed
    # into the next minute would find that minute due too).
    due = timezone.now().replace(second=0, microsecond=0)
    now = due + timedelta(seconds=1)
    behind = due_at(held, due)
    due_at(free, due)
    with another_session() as holder:
        holder.execute("SELECT 1 FROM automations WHERE id = %s FOR UPDATE", [held.pk])
        # DB_LOCK_TIMEOUT, short for the test's sake, on the scheduler's connection.
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '300ms'")
        try:
            with caplog.at_level(logging.INFO, logger="hubdommed.schedule"):
                firing = schedules_fire_due(now=now)
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET lock_timeout")
        holder.rollback()

    assert Job.objects.filter(automation=free).count() == 1
    assert not Job.objects.filter(automation=held).exists()
    assert behind.pk in firing.held
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert any(f"schedule {behind.pk}: left for the next cycle" in e for e in errors), errors
    # The next cycle, the lock gone, fires it.
    schedules_fire_due(now=now)
    assert Job.objects.filter(automation=held).count() == 1
