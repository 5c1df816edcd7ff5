"""What the worker tells operators: its metrics, its heartbeat, and one log line per run
written with the run's ids."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from common.context import log_context
from common.logs import ContextFilter
from common.metrics import registry
from outbox.services import dispatch
from tests.worker.conftest import run_finished, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def sample(name: str, **labels: str) -> float:
    return registry().get_sample_value(name, labels) or 0.0


class Remember(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(ContextFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def finished_lines(handler: Remember) -> list[logging.LogRecord]:
    return [r for r in list(handler.records) if r.getMessage() == "task run finished"]


def test_a_run_is_counted_timed_and_logged_with_its_ids(broker, relay, start_worker):
    handler = Remember()
    logger = logging.getLogger("hubdommed.worker")
    logger.addHandler(handler)
    before = {
        "succeeded": sample("hubdommed_task_runs_total", task="test.work", outcome="succeeded"),
        "failed": sample("hubdommed_task_runs_total", task="test.work", outcome="failed"),
        "parked": sample("hubdommed_messages_dead_lettered_total", queue="default"),
        "timed": sample("hubdommed_task_run_duration_seconds_count", task="test.work"),
    }
    try:
        start_worker(concurrency=2)
        with log_context(correlation_id="corr-1"), transaction.atomic():
            good = str(dispatch("test.work", {"job_id": 42}))
        with transaction.atomic():
            bad = str(dispatch("test.work", {"permanent": True}))
        wait_for(lambda: run_finished(good) and run_finished(bad), what="both runs to finish")
        # Each run's line is written after its row is settled: wait for the lines too.
        wait_for(
            lambda: {good, bad} <= {getattr(r, "run_id", None) for r in finished_lines(handler)},
            what="both runs' finished lines",
        )
        wait_for(
            lambda: (
                sample("hubdommed_task_runs_total", task="test.work", outcome="succeeded")
                == before["succeeded"] + 1
            ),
            what="the success to be counted",
        )
    finally:
        logger.removeHandler(handler)

    assert sample("hubdommed_task_runs_total", task="test.work", outcome="failed") == (
        before["failed"] + 1
    )
    assert sample("hubdommed_messages_dead_lettered_total", queue="default") == before["parked"] + 1
    assert sample("hubdommed_task_run_duration_seconds_count", task="test.work") == (
        before["timed"] + 2
    )
    assert sample("hubdommed_daemon_heartbeat_timestamp_seconds", daemon="worker") > 0
    finished = finished_lines(handler)
    mine = [r for r in finished if r.run_id == good]
    assert len(mine) == 1
    line = mine[0]
    assert (line.levelno, line.correlation_id, str(line.job_id), line.task, line.outcome) == (
        logging.INFO,
        "corr-1",
        "42",
        "test.work",
        "succeeded",
    )
    assert line.duration >= 0
    assert [r.outcome for r in finished if r.run_id == bad] == ["failed"]
