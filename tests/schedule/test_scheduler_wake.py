"""The scheduler sleeps until the next due time, or until a change to a schedule wakes it."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from outbox.wake import signal_key
from schedule.management.commands.run_scheduler import Command
from schedule.models import Schedule
from schedule.services import schedule_pause, schedule_resume
from schedule.wake import scheduler_wake_key
from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment, wait_until_it_handles
from tests.schedule.support import jobs_of, new_schedule


def _yearly(tenant, automation) -> Schedule:
    return new_schedule(tenant=tenant, automation=automation, cron="0 0 1 1 *")


@pytest.mark.django_db
def test_the_pause_ends_at_the_next_due_time_bounded_by_the_interval(tenant, automation):
    schedule = _yearly(tenant, automation)
    command = Command()
    command.interval = 30
    began = time.monotonic()

    assert command.pause_deadline(began) == pytest.approx(began + 30, abs=0.5)

    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=timezone.now() + timedelta(seconds=3)
    )
    assert command.pause_deadline(began) == pytest.approx(time.monotonic() + 3, abs=0.5)


@pytest.mark.django_db(transaction=True)
def test_a_schedule_resumed_wakes_a_sleeping_scheduler(tenant, automation, redis_conn):
    schedule = _yearly(tenant, automation)
    schedule_pause(tenant=tenant, schedule_id=schedule.pk)
    redis_conn.delete(scheduler_wake_key())
    command = Command()
    woken = []
    sleeper = threading.Thread(
        target=lambda: woken.append(command.wait_for_wake(time.monotonic() + 60))
    )
    sleeper.start()
    try:
        schedule_resume(tenant=tenant, schedule_id=schedule.pk)
        wait_until(lambda: woken, timeout=30, message="the sleeping scheduler to wake")
    finally:
        command.stop.set()
        sleeper.join(timeout=10)
    assert woken == ["signal"]


@pytest.mark.django_db
def test_with_redis_away_the_scheduler_sleeps_until_its_deadline(settings, caplog):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    command = Command()
    began = time.monotonic()

    assert command.wait_for_wake(began + 0.5) == "due"
    assert time.monotonic() - began >= 0.5
    assert "Redis unreachable" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_real_scheduler_starts_a_run_within_a_second_of_its_due_time(
    settings, tmp_path, tenant, automation
):
    schedule = _yearly(tenant, automation)
    Schedule.objects.filter(pk=schedule.pk).update(cron="* * * * *")
    alive = tmp_path / "scheduler.alive"
    # A sweep every minute: only sleeping until the due time starts the run on time.
    process = subprocess.Popen(
        [sys.executable, "manage.py", "run_scheduler", "--interval", "60"],
        cwd=django_settings.BASE_DIR,
        env=process_environment(settings, LIVENESS_FILE=str(alive)),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(alive.exists, timeout=60, message="the scheduler's first cycle")
        # The first minute at least two seconds away (an every-minute calendar's due time).
        due = (timezone.now() + timedelta(seconds=62)).replace(second=0, microsecond=0)
        # As a change made behind the services' back would be, then announced.
        Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)
        signal_key(scheduler_wake_key())
        (job,) = wait_until(lambda: jobs_of(schedule), timeout=90, message="the run to start")
    finally:
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        _out, err = process.communicate(timeout=30)

    assert process.returncode == 0, err
    assert job.triggered_by["due_at"] == due.isoformat()
    lateness = (job.created_at - due).total_seconds()
    assert 0 <= lateness < 1.0, lateness
