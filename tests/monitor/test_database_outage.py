"""The monitor outlives a PostgreSQL restart and terminated backends, on a private cluster."""

from __future__ import annotations

import time

import pytest

from tests.private_services import Daemon, private_environment

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_monitor_recovers_from_a_database_restart_and_terminated_backends(
    settings, private_postgres, migrated_database
):
    pg, database = private_postgres, migrated_database
    monitor = Daemon(
        "watch_stuck_jobs",
        "--interval",
        "0.5",
        env=private_environment(settings, postgres=pg, database=database, LOG_LEVEL="info"),
    )
    try:
        monitor.wait_for_line("0 step errors", 30)

        for name, breaks in (
            ("restart", lambda: pg.restart("fast")),
            ("backends terminated", lambda: pg.terminate_backends(database)),
        ):
            seen = len(monitor.lines)
            broken = time.monotonic()
            breaks()
            # A whole cycle of queries that worked, after the outage.
            monitor.wait_for_line("0 step errors", 20, after=seen)
            print(
                f"\nmonitor, database {name}: clean cycle {time.monotonic() - broken:.1f} s after"
            )
    finally:
        code = monitor.stop()
    assert code == 0, monitor.log
    # An outage is expected: warnings, not tracebacks.
    assert "Traceback" not in monitor.log, monitor.log
