"""The hub's HTTP servers as the tests' own processes: the API (gunicorn, ``hubdommed.wsgi``)
and the stream process (uvicorn, ``hubdommed.asgi``), each on a port of its own, over the
test database and this run's Redis keys, stopped and started again on the same port."""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tests.polling import wait_until
from tests.ports import HOST, free_port
from tests.processes import process_environment

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def accepts(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=0.5):
        return True
    return False


class Server:
    def __init__(self, name: str, command: list[str], settings, logs: Path, **env: str) -> None:
        self.name = name
        self.port = free_port()
        self.command = [part.format(port=self.port, host=HOST) for part in command]
        self.env = process_environment(settings, PYTHONUNBUFFERED="1", **env)
        self.logs = logs
        self.process: subprocess.Popen | None = None
        self.starts = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def start(self) -> Server:
        self.starts += 1
        log = open(self.logs / f"{self.name}-{self.starts}.log", "ab")  # noqa: SIM115
        self.process = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        wait_until(
            lambda: self.process.poll() is not None or accepts(self.port),
            timeout=60,
            message=lambda: f"{self.name} listening on {self.port}\n{self.log_text()}",
        )
        assert self.process.poll() is None, self.log_text()
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_text(self) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
            for path in sorted(self.logs.glob(f"{self.name}-*.log"))
        )


def exchange(server: Server, request: bytes) -> tuple[bytes, bytes]:
    """Send ``request`` as raw bytes (what a client library would not send) and read the
    answer until the server closes: (its head, its body)."""
    with socket.create_connection((HOST, server.port), timeout=20) as conn:
        conn.sendall(request)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def stream_server(settings, logs: Path, **env: str) -> Server:
    """``uvicorn hubdommed.asgi:application``, as the Procfile's ``stream`` line runs it."""
    command = [str(BIN / "uvicorn"), "hubdommed.asgi:application", "--host", "{host}"]
    command += ["--port", "{port}", "--http", "hubdommed.stream_http:JsonRefusals"]
    command += ["--no-access-log", "--timeout-graceful-shutdown", "2"]
    return Server("stream", command, settings, logs, **env)


def api_server(settings, logs: Path, **env: str) -> Server:
    """``gunicorn -c gunicorn.conf.py hubdommed.wsgi``, as the Procfile's ``web`` line runs it."""
    server = Server(
        "api",
        [str(BIN / "gunicorn"), "-c", "gunicorn.conf.py", "hubdommed.wsgi:application"],
        settings,
        logs,
        **env,
    )
    server.env.update(HOST=HOST, PORT=str(server.port))
    server.env.setdefault("WEB_CONCURRENCY", "1")
    return server


def stop_all(*servers: Server) -> None:
    for server in servers:
        with contextlib.suppress(ProcessLookupError):
            server.stop()
