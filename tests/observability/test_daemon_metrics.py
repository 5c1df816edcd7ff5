"""A daemon's metrics endpoint: on loopback unless told otherwise, where it says it is, and
a port already in use costs one line, not the daemon."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from common.metrics import serve_metrics
from tests.ports import HOST, free_port
from tests.processes import process_environment

ROOT = Path(__file__).resolve().parents[2]


def listening_addresses(port: int) -> set[str]:
    """The IPv4 addresses something listens on at ``port`` (the kernel's table)."""
    addresses = set()
    with open("/proc/net/tcp") as table:
        next(table)
        for row in table:
            local, state = row.split()[1], row.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                addresses.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return addresses


def test_a_daemons_metrics_listen_on_loopback_unless_told_otherwise(settings, caplog):
    caplog.set_level(logging.INFO, logger="common.metrics")
    port = free_port()
    server = serve_metrics("relay", port=port)
    try:
        assert listening_addresses(port) == {"127.0.0.1"}
        assert (
            "hubdommed_daemon_heartbeat"
            in requests.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        )
    finally:
        server.shutdown()
        server.server_close()
    assert f"relay metrics on http://127.0.0.1:{port}/metrics" in caplog.messages


def test_a_daemons_metrics_listen_where_metrics_host_says(settings, caplog):
    caplog.set_level(logging.INFO, logger="common.metrics")
    settings.METRICS_HOST = "0.0.0.0"  # noqa: S104 (what a container is given)
    port = free_port()
    server = serve_metrics("worker", port=port)
    try:
        assert listening_addresses(port) == {"0.0.0.0"}  # noqa: S104
    finally:
        server.shutdown()
        server.server_close()
    assert f"worker metrics on http://0.0.0.0:{port}/metrics" in caplog.messages


def test_metrics_port_zero_is_off_and_says_so(settings, caplog):
    caplog.set_level(logging.INFO, logger="common.metrics")
    settings.METRICS_PORT = 0
    assert serve_metrics("monitor") is None
    assert caplog.messages == ["monitor metrics off (METRICS_PORT is 0)"]


@pytest.mark.django_db(transaction=True)
def test_a_metrics_port_in_use_is_one_line_and_the_daemon_carries_on(settings):
    with socket.socket() as taken:
        taken.bind((HOST, free_port()))
        taken.listen()
        port = taken.getsockname()[1]
        scheduler = subprocess.run(
            [sys.executable, "manage.py", "run_scheduler", "--once"],
            cwd=ROOT,
            env=process_environment(settings, METRICS_PORT=str(port), LOG_LEVEL="info"),
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert scheduler.returncode == 0, scheduler.stderr
    about_metrics = [line for line in scheduler.stderr.splitlines() if "metrics" in line]
    assert len(about_metrics) == 1, scheduler.stderr
    assert (
        f"scheduler metrics not served: cannot listen on 127.0.0.1:{port} "
        "(Address already in use); carrying on without them"
    ) in about_metrics[0]
    assert "Traceback" not in scheduler.stderr
    assert "scheduler stopped after 1 cycles" in scheduler.stdout
