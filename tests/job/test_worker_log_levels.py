"""What an automation's worker does all day is logged at debug: its poll when there is nothing
to take, and the 409 of a claim refused as the protocol expects. What moves a job stays at
info."""

from __future__ import annotations

import logging

import pytest

from tests.factories import JobFactory, RunningJobFactory

pytestmark = pytest.mark.django_db


def request_lines(caplog, path: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "hubdommed.http" and r.path == path]


def test_an_idle_poll_is_logged_at_debug(worker_api, caplog):
    with caplog.at_level(logging.DEBUG):
        assert worker_api.get("/api/v1/worker/jobs").json() == []

    (line,) = request_lines(caplog, "/api/v1/worker/jobs")
    assert line.levelno == logging.DEBUG
    assert line.status == 200


def test_a_poll_that_finds_work_is_logged_at_info(worker, worker_api, caplog):
    JobFactory(automation=worker.automation)

    with caplog.at_level(logging.DEBUG):
        assert len(worker_api.get("/api/v1/worker/jobs").json()) == 1

    (line,) = request_lines(caplog, "/api/v1/worker/jobs")
    assert line.levelno == logging.INFO


def test_a_refused_claims_409_is_logged_at_debug_and_its_reason_once_at_info(
    worker, worker_api, caplog
):
    job = RunningJobFactory(automation=worker.automation)
    path = f"/api/v1/jobs/{job.id}/start"

    with caplog.at_level(logging.DEBUG):
        assert worker_api.post(path).status_code == 409

    (line,) = request_lines(caplog, path)
    assert (line.levelno, line.status) == (logging.DEBUG, 409)
    info_or_more = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert info_or_more == [f"claim of job {job.id} by worker {worker.pk} refused: already_claimed"]


def test_a_claim_is_logged_at_info(worker, worker_api, caplog):
    job = JobFactory(automation=worker.automation)
    path = f"/api/v1/jobs/{job.id}/start"

    with caplog.at_level(logging.DEBUG):
        assert worker_api.post(path).status_code == 200

    (line,) = request_lines(caplog, path)
    assert (line.levelno, line.status) == (logging.INFO, 200)
