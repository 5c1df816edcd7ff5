"""With ``LOG_FORMAT=json`` every line a process writes is a JSON object: gunicorn's own lines
(start-up, its refusals), an exception nothing caught (one record, its traceback inside) and
the daemons' stop lines; real processes, their whole output read."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from tests.deploy.servers import gunicorn
from tests.private_services import Daemon
from tests.processes import process_environment, wait_until_it_handles

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


def records(output: str) -> list[dict]:
    """Each line of ``output`` as the object it must be (a line that is not fails here)."""
    lines = [line for line in output.splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line: {line!r}\nin:\n{output}")
    return parsed


@pytest.mark.django_db(transaction=True)
def test_gunicorns_own_lines_are_json(settings, tmp_path):
    with gunicorn(settings, tmp_path, LOG_FORMAT="json") as server:
        assert requests.get(f"{server.url}/api/v1/jobs", timeout=10).status_code == 401
        refused = requests.get(f"{server.url}/api/?q={'x' * 5000}", timeout=10)
        assert refused.status_code == 414
    lines = records(server.text())
    by_logger = {}
    for line in lines:
        by_logger.setdefault(line["logger"], []).append(line["message"])
    assert any(m.startswith("Listening at: http://127.0.0.1:") for m in by_logger["gunicorn.error"])
    assert any(m.startswith("Booting worker") for m in by_logger["gunicorn.error"])
    assert any(
        m.startswith("Invalid request from ip=127.0.0.1") for m in by_logger["gunicorn.error"]
    )
    assert any(m.startswith("Shutting down") for m in by_logger["gunicorn.error"])
    assert any(m.startswith("GET /api/v1/jobs 401") for m in by_logger["hubdommed.http"])


def test_an_exception_nothing_caught_is_one_json_record(settings):
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "raise RuntimeError('the disk is full')"],
        cwd=ROOT,
        env=process_environment(settings, LOG_FORMAT="json"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    (line,) = records(result.stderr)
    assert line["level"] == "CRITICAL"
    assert line["logger"] == "hubdommed.uncaught"
    assert line["message"] == "uncaught RuntimeError: the disk is full"
    assert line["exc_info"].startswith("Traceback (most recent call last):")
    assert line["exc_info"].endswith("RuntimeError: the disk is full")


def test_an_exception_nothing_caught_keeps_its_traceback_in_text(settings):
    result = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", "raise RuntimeError('the disk is full')"],
        cwd=ROOT,
        env=process_environment(settings, LOG_FORMAT="text"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):")


@pytest.mark.django_db(transaction=True)
def test_a_daemons_stop_line_is_json(settings):
    result = subprocess.run(
        [sys.executable, "manage.py", "run_scheduler", "--once"],
        cwd=ROOT,
        env=process_environment(settings, LOG_FORMAT="json", LOG_LEVEL="info"),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
    messages = [line["message"] for line in records(result.stderr)]
    assert messages[-1] == "scheduler stopped after 1 cycles: 0 jobs started"


def test_the_background_workers_stop_line_is_json(settings):
    worker = Daemon(
        "run_worker",
        env=process_environment(settings, LOG_FORMAT="json", LOG_LEVEL="info", BROKER="rabbitmq"),
    )
    try:
        worker.wait_for_line("consuming", timeout=60)
        wait_until_it_handles(worker.process, signal.SIGTERM)
    finally:
        code = worker.stop()
    assert code == 0, worker.log
    assert worker.out == ""
    messages = [line["message"] for line in records(worker.log)]
    assert "stopped" in messages[-1], worker.log
