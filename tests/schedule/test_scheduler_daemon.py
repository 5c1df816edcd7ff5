"""``manage.py run_scheduler``: its steps, and two of them racing as real processes."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
from collections import Counter

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from automation.models import Automation
from job.models import Job
from schedule.management.commands.run_scheduler import Command
from schedule.models import Schedule
from tests.polling import wait_until
from tests.processes import process_environment, wait_until_it_handles
from tests.schedule.support import jobs_of, new_schedule


def _due_now(schedule: Schedule) -> None:
    # As if it had been created in the minute before this one: the current minute is due,
    # and only it (the earlier ones, within the grace, would start too). Hourly at that
    # minute: a cycle that ends up in the next minute (a slow machine) finds one due time,
    # not two.
    due = timezone.now().replace(second=0, microsecond=0)
    Schedule.objects.filter(pk=schedule.pk).update(cron=f"{due.minute} * * * *", next_run_at=due)


@pytest.mark.django_db
def test_one_cycle_fires_due_schedules_and_ends_those_of_deactivated_automations(
    tenant, automation
):
    due = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")
    _due_now(due)
    other_automation = Automation.objects.create(
        name="retired", slug="retired", sector=automation.sector, command=["true"]
    )
    orphan = new_schedule(tenant=tenant, automation=other_automation, cron="0 0 1 1 *")
    Automation.objects.filter(pk=other_automation.pk).update(is_active=False)

    command = Command()
    command.run_cycle()

    assert len(jobs_of(due)) == 1 and command.started == 1
    orphan.refresh_from_db()
    assert orphan.status == "deactivated"
    assert orphan.deactivated_reason == "Its automation was deactivated."


@pytest.mark.django_db(transaction=True)
def test_two_schedulers_racing_start_each_due_time_once_and_exit_0_on_sigterm(
    settings, tmp_path, tenant, automation
):
    schedules = [
        new_schedule(tenant=tenant, automation=automation, name=f"s{n}", cron="* * * * *")
        for n in range(20)
    ]
    for schedule in schedules:
        _due_now(schedule)
    # Each touches its liveness file after a cycle: by then its signal handlers are set.
    alive = [tmp_path / f"scheduler-{n}.alive" for n in range(2)]
    processes = [
        subprocess.Popen(
            [sys.executable, "manage.py", "run_scheduler", "--interval", "0.2"],
            cwd=django_settings.BASE_DIR,
            env=process_environment(settings, LIVENESS_FILE=str(path)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for path in alive
    ]
    try:
        wait_until(
            lambda: all(jobs_of(schedule) for schedule in schedules),
            timeout=60,
            message="every schedule to start its job",
        )
        wait_until(
            lambda: all(path.exists() for path in alive),
            timeout=60,
            message="both schedulers to finish a cycle",
        )
    finally:
        for process in processes:
            # Even when a wait above failed: a scheduler that did no cycle yet may still be
            # starting, and one signalled before it handles SIGTERM dies by it.
            wait_until_it_handles(process, signal.SIGTERM)
            process.send_signal(signal.SIGTERM)
        outcomes = [process.communicate(timeout=30) for process in processes]

    for process, (out, err) in zip(processes, outcomes, strict=True):
        assert process.returncode == 0, err
        assert "scheduler stopped after" in out
    runs = Counter(
        (job.triggered_by["schedule"], job.triggered_by["due_at"]) for job in Job.objects.all()
    )
    assert runs and max(runs.values()) == 1


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.mark.django_db
def test_a_cycle_counts_what_it_started_and_beats_the_heartbeat(
    settings, tmp_path, tenant, automation
):
    settings.LIVENESS_FILE = str(tmp_path / "scheduler.alive")
    due = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")
    _due_now(due)
    cycles = _sample("hubdommed_scheduler_cycles_total")
    started = _sample("hubdommed_scheduler_runs_total", outcome="started")

    Command().run_cycle()

    assert _sample("hubdommed_scheduler_cycles_total") == cycles + 1
    assert _sample("hubdommed_scheduler_runs_total", outcome="started") == started + 1
    assert _sample("hubdommed_daemon_heartbeat_timestamp_seconds", daemon="scheduler") > 0
    assert (tmp_path / "scheduler.alive").exists()


def test_once_started_the_scheduler_keeps_what_it_loaded_out_of_the_collector_s_sight(settings):
    settings.METRICS_PORT = 0
    gc.unfreeze()
    try:
        Command().starting()

        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
