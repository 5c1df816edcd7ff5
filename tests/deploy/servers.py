"""The API under real gunicorn, as ``make run`` and the image start it (``gunicorn.conf.py``),
and the production variables it needs when ``DEBUG`` is off."""

from __future__ import annotations

import base64
import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import requests

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment

ROOT = Path(__file__).resolve().parents[2]


def production_variables(**extra: str) -> dict[str, str]:
    """``DEBUG`` off, with the keys it requires and the host a test reaches it by."""
    return {
        "DEBUG": "false",
        "SECRET_KEY": secrets.token_urlsafe(50),
        "WEBHOOK_SECRET_KEYS": base64.urlsafe_b64encode(secrets.token_bytes(32)).decode(),
        "ALLOWED_HOSTS": "127.0.0.1",
        **extra,
    }


@dataclass
class Server:
    url: str
    log: Path
    process: subprocess.Popen

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        return self.process.returncode


@contextlib.contextmanager
def gunicorn(settings, tmp_path: Path, **variables: str) -> Iterator[Server]:
    """gunicorn on a free loopback port over this run's database; stopped at the end."""
    port = free_port()
    log_path = tmp_path / f"gunicorn-{port}.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "-c",
                "gunicorn.conf.py",
                "hubdommed.wsgi:application",
            ],
            cwd=ROOT,
            env=process_environment(
                settings,
                HOST="127.0.0.1",
                PORT=str(port),
                WEB_CONCURRENCY="1",
                PROMETHEUS_MULTIPROC_DIR=str(tmp_path / f"metrics-{port}"),
                **variables,
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Server(f"http://127.0.0.1:{port}", log_path, process)

    def up() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"gunicorn exited {process.returncode}:\n{server.text()}")
        with contextlib.suppress(requests.ConnectionError, requests.Timeout):
            return requests.get(f"{server.url}/health/live", timeout=5).status_code == 200
        return False

    try:
        wait_until(up, timeout=60, message=server.text)
        yield server
    finally:
        server.stop()


def collectstatic(settings, **variables: str) -> None:
    """``manage.py collectstatic`` into the ``STATIC_ROOT`` that ``variables`` name."""
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--no-input", "-v", "0"],
        cwd=ROOT,
        env=process_environment(settings, **variables),
        check=True,
        capture_output=True,
        timeout=300,
    )
