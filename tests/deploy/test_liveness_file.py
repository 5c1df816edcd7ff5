"""A daemon's liveness file: fresh while its loop runs, and saying what degrades it.

A daemon without Redis (it sweeps instead) or with its publishing blocked by a broker's
alarm is healthy: the container's check passes, and prints the condition for whoever
reads it (``docker inspect``'s health log, the orchestrator's events).
"""

from __future__ import annotations

import json

from common.accelerator import redis_hold_off
from common.metrics import Heartbeat
from lifecycle import conditions
from tests.deploy.test_compose import run_check


def read(path) -> dict:
    return json.loads(path.read_text())


def test_the_file_says_ok_then_what_degrades_the_daemon_and_since_when(tmp_path):
    alive = tmp_path / "alive" / "relay"
    Heartbeat("relay", str(alive)).beat()
    state = read(alive)
    assert state["daemon"] == "relay"
    assert state["status"] == "ok"
    assert state["degraded"] == {}

    conditions.degraded("rabbitmq", "publishing blocked by the broker (low on memory)")
    Heartbeat("relay", str(alive)).beat()
    state = read(alive)
    assert state["status"] == "degraded"
    assert state["degraded"]["rabbitmq"]["detail"] == (
        "publishing blocked by the broker (low on memory)"
    )
    since = state["degraded"]["rabbitmq"]["since"]
    # Reported again while it lasts: still the same condition, since the first report.
    conditions.degraded("rabbitmq", "publishing blocked by the broker (low on disk)")
    assert conditions.current()["rabbitmq"]["since"] == since

    conditions.recovered("rabbitmq")
    Heartbeat("relay", str(alive)).beat()
    assert read(alive)["status"] == "ok"
    # Written whole, by a rename: no partial file left beside it.
    assert [p.name for p in alive.parent.iterdir()] == ["relay"]


def test_the_health_check_passes_a_degraded_daemon_and_prints_why(tmp_path):
    alive = tmp_path / "scheduler.alive"
    conditions.degraded("redis", "unreachable: due schedules looked for every 1 s")
    Heartbeat("scheduler", str(alive)).beat()
    result = run_check("--liveness", str(alive), "--max-age", "60")
    assert result.returncode == 0, result.stderr
    assert "alive, redis degraded since" in result.stdout
    assert "due schedules looked for every 1 s" in result.stdout

    # A file of an older release, empty, or anything unreadable as JSON: its age decides.
    alive.write_text("")
    result = run_check("--liveness", str(alive), "--max-age", "60")
    assert result.returncode == 0 and result.stdout == ""
    alive.write_text("[1, 2")
    assert run_check("--liveness", str(alive), "--max-age", "60").returncode == 0


def test_redis_held_off_is_a_condition_until_the_hold_off_ends():
    # Nothing listens on port 1: the first failure holds Redis off.
    hold_off = redis_hold_off("redis://127.0.0.1:1/0")
    assert hold_off.failed()
    assert "not answering" in conditions.current()["redis"]["detail"]
    hold_off.end()
    assert "redis" not in conditions.current()
