"""``watch_stuck_jobs`` as a daemon: one cycle, one line of counts, failures contained,
and the process end to end (``--once``, and SIGTERM while it loops)."""

from __future__ import annotations

import signal
import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings as django_settings
from django.core.management import CommandError, call_command

from job.models import Job
from tests.factories import AutomationFactory
from tests.job.support import events_of
from tests.monitor.conftest import power_ons
from tests.processes import process_environment, wait_until_it_handles


@pytest.mark.django_db
def test_a_cycle_runs_every_step_and_logs_one_line_of_counts(monitor, pending_for, lost, caplog):
    caplog.set_level("INFO", logger="hubdommed.monitor")
    pending_for(600)
    lost()
    lost(automation=AutomationFactory(max_attempts=2))

    counts = monitor.run_cycle()

    assert counts.powered_on == 1 and counts.machines_stopped == 0 and counts.errors == 0
    assert (counts.settled["failed"], counts.settled["requeued"]) == (1, 1)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("monitor cycle")]
    assert lines == [
        "monitor cycle: power-on re-sent for 1 automations; 0 silent workers restarted; "
        "lost workers: 1 failed, "
        "1 requeued, 0 canceled, 0 alive after all, 0 errors; 0 idle machines stopped; "
        "stranded rows: 0 repaired, 0 left to an operator; 0 step errors"
    ]


@pytest.mark.django_db
def test_a_failing_step_is_logged_and_the_others_still_run(monitor, pending_for, lost, caplog):
    job = lost()
    pending_for(600)

    def broken():
        raise RuntimeError("the first step broke")

    monitor.power_on_for_pending = broken
    counts = monitor.run_cycle()

    assert counts.errors == 1
    assert "monitor step broken failed" in caplog.text and "the first step broke" in caplog.text
    assert Job.objects.get(pk=job.pk).status == Job.Status.FAILED


@pytest.mark.django_db
def test_a_job_that_cannot_be_settled_does_not_hold_up_the_others(
    monitor, lost, caplog, monkeypatch
):
    from job.management.commands import watch_stuck_jobs

    first, second = lost(), lost()
    real = watch_stuck_jobs.job_settle_lost

    def settle(*, job_id):
        if job_id == first.id:
            raise RuntimeError("a bad row")
        return real(job_id=job_id)

    monkeypatch.setattr(watch_stuck_jobs, "job_settle_lost", settle)
    settled = monitor.settle_lost_jobs()

    assert (settled["error"], settled["failed"]) == (1, 1)
    assert Job.objects.get(pk=second.pk).status == Job.Status.FAILED
    assert f"could not settle job {first.id}" in caplog.text


def test_a_non_positive_interval_is_refused():
    with pytest.raises(CommandError, match="--interval"):
        call_command("watch_stuck_jobs", "--once", "--interval", "0", stdout=StringIO())


def monitor_environment(settings, **extra) -> dict[str, str]:
    return process_environment(settings, LOG_LEVEL="info", **extra)


def run_monitor(settings, *args: str, **env) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "manage.py", "watch_stuck_jobs", *args],
        cwd=django_settings.BASE_DIR,
        env=monitor_environment(settings, **env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.django_db(transaction=True)
def test_the_command_runs_one_cycle_with_once_and_exits_0(settings, pending_for, lost):
    stuck = pending_for(600)
    gone = lost()

    process = run_monitor(settings, "--once", MONITOR_PENDING_SECONDS="180")
    out, err = process.communicate(timeout=60)

    assert process.returncode == 0, err
    assert "monitor stopped after 1 cycles" in out
    cycle_lines = [line for line in err.splitlines() if "monitor cycle:" in line]
    assert len(cycle_lines) == 1
    assert "power-on re-sent for 1 automations" in cycle_lines[0]
    assert "1 failed" in cycle_lines[0]
    assert power_ons() == [stuck.automation_id]
    gone.refresh_from_db()
    assert gone.failure_reason == Job.FailureReason.WORKER_LOST
    assert events_of(gone.id) == ["JobFailed"]


@pytest.mark.django_db(transaction=True)
def test_sigterm_stops_the_looping_command_between_cycles_with_exit_0(settings):
    # An interval far longer than the test may wait: only a prompt stop lets it pass.
    process = run_monitor(settings, "--interval", "3600")
    try:
        for line in process.stderr:
            if "monitor cycle:" in line:
                break
        else:
            pytest.fail("the monitor ended before its first cycle")
        wait_until_it_handles(process, signal.SIGTERM)
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 0, err
    assert "monitor stopped after 1 cycles" in out
