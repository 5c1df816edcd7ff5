"""A row lock another session holds without end (an operator's psql left in a
transaction, a stalled request) bounds the scheduler's wait by ``DB_LOCK_TIMEOUT``: the
cycle ends with an error naming the lock, the schedule's own row is let go, and the job
starts once the holder lets go. Before, the scheduler waited in silence for as long as the
holder held, with its schedule row locked."""

from __future__ import annotations

import pytest
from django.utils import timezone

from job.models import Job
from schedule.models import Schedule
from tests.factories import AutomationWithWorkerFactory, TenantFactory
from tests.locks import another_session
from tests.polling import wait_until
from tests.private_services import Daemon
from tests.processes import process_environment

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


def test_a_lock_held_without_end_bounds_the_schedulers_wait(settings):
    automation = AutomationWithWorkerFactory()
    schedule = Schedule.objects.create(
        tenant=TenantFactory(),
        automation=automation,
        name="held",
        cron="* * * * *",
    )
    # Due now: this minute's time on its calendar (a save plans the next minute's).
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=timezone.now().replace(second=0, microsecond=0)
    )
    env = process_environment(settings, DB_LOCK_TIMEOUT="1", LOG_LEVEL="info")
    with another_session() as holder:
        # What an automation's update takes, held and then left idle.
        holder.execute("SELECT 1 FROM automations WHERE id = %s FOR UPDATE", [automation.pk])
        scheduler = Daemon("run_scheduler", "--interval", "0.2", env=env)
        try:
            scheduler.wait_for_line("lock timeout", 30)
            # Between two cycles nothing holds the schedule's row.
            wait_until(
                lambda: holder.execute(
                    "SELECT 1 FROM schedules WHERE id = %s FOR UPDATE SKIP LOCKED",
                    [schedule.pk],
                ).fetchone(),
                timeout=10,
                message=lambda: scheduler.log,
            )
            holder.rollback()
            wait_until(
                lambda: Job.objects.filter(automation=automation).exists(),
                timeout=30,
                message=lambda: scheduler.log,
            )
        finally:
            scheduler.stop()


def test_other_commands_than_the_daemons_carry_no_lock_timeout(settings):
    # ``migrate`` builds indexes concurrently: such a build waits for every older
    # transaction, and one given up half-way leaves an invalid index behind.
    import subprocess
    import sys

    from django.conf import settings as django_settings

    env = process_environment(settings, DB_LOCK_TIMEOUT="1")
    show = (
        "from django.db import connection\n"
        "with connection.cursor() as cursor:\n"
        "    cursor.execute('SHOW lock_timeout')\n"
        "    print(cursor.fetchone()[0])"
    )
    shown = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", show],
        cwd=django_settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert shown.stdout.strip().splitlines()[-1] == "0"
