"""A database that goes away during a monitor cycle is one line with its reason, never a
traceback: the monitor's end-of-cycle record, like its steps, meets a restart as often as
any of them (seen when PostgreSQL shut down between the last step and that record)."""

from __future__ import annotations

import logging

import pytest
from django.db import OperationalError

from job.management.commands import watch_stuck_jobs
from lifecycle.failures import log_failure

pytestmark = pytest.mark.django_db


def shut_down() -> None:
    raise OperationalError(
        'connection failed: connection to server at "127.0.0.1" failed: FATAL:  the database '
        "system is shutting down\n\tThis probably means the server terminated abnormally"
    )


def test_the_end_of_a_cycle_during_a_restart_is_one_line_without_traceback(monkeypatch, caplog):
    monkeypatch.setattr(watch_stuck_jobs, "monitor_cycle_ended", shut_down)

    with caplog.at_level(logging.INFO, logger="hubdommed.monitor"):
        counts = watch_stuck_jobs.Command().cycle()

    assert counts.errors == 1
    (line,) = [r for r in caplog.records if "end of its cycle" in r.getMessage()]
    assert line.levelno == logging.WARNING and line.exc_info is None
    assert line.getMessage() == (
        "monitor could not record the end of its cycle: database unreachable (connection "
        'failed: connection to server at "127.0.0.1" failed: FATAL:  the database system is '
        "shutting down)"
    )


def test_a_defect_keeps_its_traceback(caplog):
    logger = logging.getLogger("hubdommed.test")
    try:
        {}["missing"]
    except KeyError as exc:
        with caplog.at_level(logging.INFO, logger="hubdommed.test"):
            log_failure(logger, exc, "claiming %d runs failed", 3)

    (line,) = caplog.records
    assert (line.levelno, line.getMessage()) == (logging.ERROR, "claiming 3 runs failed")
    assert line.exc_info is not None and line.exc_info[0] is KeyError
