"""The stuck-job monitor's metrics, heartbeat and log ids."""

from __future__ import annotations

import logging
from io import StringIO
from pathlib import Path

import pytest

from job.management.commands.watch_stuck_jobs import Command
from outbox.models import PlatformOutboxMessage
from tests.factories import AutomationFactory
from tests.monitor.conftest import lost, pending_for  # noqa: F401 (fixtures)
from tests.observability.conftest import LogLines, sample

pytestmark = pytest.mark.django_db


@pytest.fixture
def monitor(settings, tmp_path):
    settings.LIVENESS_FILE = str(tmp_path / "alive" / "monitor")
    return Command(stdout=StringIO(), stderr=StringIO())


def actions() -> dict[str, float]:
    return {
        action: sample("hubdommed_monitor_jobs_total", action=action)
        for action in (
            "power_on_resent",
            "lost_failed",
            "lost_requeued",
            "lost_canceled",
            "lost_alive",
            "lost_error",
            "lease_renewed",
            "worker_restarted",
            "machine_stopped",
        )
    }


def test_a_cycle_counts_itself_and_what_it_did(monitor, pending_for, lost):  # noqa: F811
    cycles, before = sample("hubdommed_monitor_cycles_total"), actions()
    pending_for(600)
    lost()
    lost(automation=AutomationFactory(max_attempts=2))

    monitor.run_cycle()

    assert sample("hubdommed_monitor_cycles_total") == cycles + 1
    done = {action: value - before[action] for action, value in actions().items()}
    assert done == {
        "power_on_resent": 1,
        "lost_failed": 1,
        "lost_requeued": 1,
        "lost_canceled": 0,
        "lost_alive": 0,
        "lost_error": 0,
        "lease_renewed": 0,
        "worker_restarted": 0,
        "machine_stopped": 0,
    }


def test_a_failing_step_is_counted_by_its_name(monitor):
    before = sample("hubdommed_monitor_step_errors_total", step="broken")

    def broken():
        raise RuntimeError("the step broke")

    monitor.power_on_for_pending = broken
    monitor.run_cycle()

    assert sample("hubdommed_monitor_step_errors_total", step="broken") == before + 1


def test_each_cycle_beats_the_heartbeat_and_touches_the_liveness_file(monitor, settings):
    monitor.run_cycle()

    beat = sample("hubdommed_daemon_heartbeat_timestamp_seconds", daemon="monitor")
    assert beat > 0
    assert Path(settings.LIVENESS_FILE).exists()


def test_what_a_cycle_causes_and_logs_carries_an_id_of_that_cycle(monitor, pending_for):  # noqa: F811
    pending_for(600)
    lines = LogLines("json")
    logger = logging.getLogger("hubdommed.monitor")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        monitor.run_cycle()
        monitor.run_cycle()
    finally:
        logger.removeHandler(lines.handler)

    cycle_lines = [line for line in lines.json() if line["message"].startswith("monitor cycle")]
    first, second = (line["correlation_id"] for line in cycle_lines)
    assert first != second  # one per cycle, not one the process keeps
    sent = [row.envelope["correlation_id"] for row in PlatformOutboxMessage.objects.order_by("id")]
    assert sent == [first, second]
