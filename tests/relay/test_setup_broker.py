"""setup_broker waits for a broker that is slow to answer, within a bounded total."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pika

from broker import topology
from tests.forwarding import Forwarder
from tests.processes import process_environment

ROOT = Path(__file__).resolve().parents[2]


def test_setup_broker_waits_for_a_broker_that_answers_late(settings):
    real = urlsplit(settings.RABBITMQ_URL)
    late = Forwarder((real.hostname or "127.0.0.1", real.port or 5672))
    url = f"amqp://{real.username or 'guest'}:{real.password or 'guest'}@127.0.0.1:{late.port}/"
    env = process_environment(settings, RABBITMQ_URL=url, BROKER="rabbitmq", PYTHONUNBUFFERED="1")
    try:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "setup_broker"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # The broker answers once the command has found it away and said it waits (it
        # gives up after BROKER_WAIT_SECONDS, which ends the lines).
        seen = []
        for line in process.stdout:
            seen.append(line)
            if "waiting for the broker" in line:
                break
        late.open()
        rest, _ = process.communicate(timeout=60)
        output = "".join(seen) + rest
    finally:
        late.close()
        if process.poll() is None:
            process.kill()

    assert process.returncode == 0, output
    assert "waiting for the broker" in output
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        connection.channel().queue_declare(topology.queue_name("critical"), passive=True)
    finally:
        connection.close()
