"""Stopping while the broker's topology is being set up: ``setup_broker`` waits up to a
minute for a broker still starting, and a stop asked for meanwhile (an orchestrator's
SIGTERM, a Ctrl-C) ends it at once with one line, not a traceback or a death by signal;
in compose the stop reaches the process at all (no shell in front of a daemon)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
# Generous for a loaded machine; a stop that works ends the wait within a second.
DEADLINE = 60


def closed_port() -> int:
    """A loopback port nothing listens on: every connection to it is refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_ends_the_wait_for_the_broker_at_once_with_one_line(signum):
    process = subprocess.Popen(
        [sys.executable, "manage.py", "setup_broker", "--wait", "600"],
        cwd=ROOT,
        env={**os.environ, "RABBITMQ_URL": f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2F"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    # Killed past the deadline whatever happens, so that no read below waits for ever.
    watchdog = threading.Timer(2 * DEADLINE, process.kill)
    watchdog.start()
    try:
        # Signalled once it waits (it says so after the first refused attempt).
        seen = []
        for line in process.stderr:
            seen.append(line)
            if "waiting for the broker" in line:
                break
        process.send_signal(signum)
        _, rest = process.communicate(timeout=DEADLINE)
    finally:
        watchdog.cancel()
        process.kill()
        process.wait()
    stderr = "".join(seen) + rest
    assert process.returncode == 1, stderr
    assert "Traceback" not in stderr
    assert (
        stderr.strip()
        .splitlines()[-1]
        .startswith("CommandError: stopped while waiting for the broker (RabbitMQ at 127.0.0.1:")
    )


def test_in_compose_each_daemon_is_its_container_s_first_process():
    # A shell as the first process ignores SIGTERM: `docker compose stop` waited its
    # 10 s for a relay still in setup_broker, then killed it.
    services = yaml.safe_load((ROOT / "compose.yaml").read_text())["services"]
    for name in ("relay", "worker", "monitor", "scheduler", "stream"):
        command = services[name]["command"]
        assert isinstance(command, list) and command[0] in {"python", "uvicorn"}, (name, command)
    # The topology is a one-off that every service of the application waits for.
    assert services["broker-setup"]["command"] == ["python", "manage.py", "setup_broker"]
    assert services["broker-setup"]["restart"] == "no"
    for name in ("api", "stream", "relay", "worker", "monitor", "scheduler"):
        waits = services[name]["depends_on"]["broker-setup"]
        assert waits == {"condition": "service_completed_successfully"}, name
