"""setup_broker waits for a broker that is slow to answer, within a bounded total."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

import pika

from relay import topology
from tests.processes import process_environment

ROOT = Path(__file__).resolve().parents[2]


class LateBroker:
    """A loopback port where the real RabbitMQ appears only once ``open()`` is called:
    until then, connections are refused (a broker still starting)."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.listener: socket.socket | None = None
        self._closed = False

    def open(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port), backlog=32)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self._closed = True
        if self.listener is not None:
            self.listener.close()


def test_setup_broker_waits_for_a_broker_that_answers_late(settings):
    real = urlsplit(settings.RABBITMQ_URL)
    late = LateBroker((real.hostname or "127.0.0.1", real.port or 5672))
    url = f"amqp://{real.username or 'guest'}:{real.password or 'guest'}@127.0.0.1:{late.port}/"
    env = process_environment(settings, RABBITMQ_URL=url, BROKER="rabbitmq")
    try:
        process = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "setup_broker"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        # The broker answers after 5 s.
        time.sleep(5)
        late.open()
        output, _ = process.communicate(timeout=60)
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
