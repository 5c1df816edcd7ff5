"""The ``local`` provider: the automation's worker as a detached process on this computer.

Only one worker process runs per automation. The provider takes an exclusive ``flock``
on ``<LOCAL_MACHINES_DIR>/<slug>.lock`` and hands that very lock to the process it starts
(an inherited file descriptor), so the lock is held exactly as long as the worker lives:
a crash releases it, and two concurrent power-ons cannot both start one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from automation.machines.base import MachineProvider, MachineState, PowerOn

LOCK_FD_ENV = "HUBDOMMED_MACHINE_LOCK_FD"


class LocalProvider(MachineProvider):
    name = "local"

    def needs_credential(self) -> bool:
        # A local machine has no provisioned secret: it gets a fresh one at each start.
        return True

    def power_on(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        slug = worker.automation.slug
        directory = machines_dir()
        lock = os.open(directory / f"{slug}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return PowerOn.ALREADY_RUNNING
            if issue_credential is None:
                raise ValueError("a local machine needs a credential to start its worker")
            self._spawn(slug, issue_credential(), lock, directory)
            return PowerOn.STARTED
        finally:
            # The child holds the lock now (same open file description); ours can go.
            os.close(lock)

    def _spawn(self, slug: str, credential: str, lock: int, directory: Path) -> None:
        env = {
            **os.environ,
            "HUB_URL": settings.HUB_URL,
            "HUBDOMMED_WORKER_CREDENTIAL": credential,
            LOCK_FD_ENV: str(lock),
        }
        log = open(directory / f"{slug}.log", "ab")  # noqa: SIM115 (handed to the child)
        try:
            process = subprocess.Popen(
                [
                    sys.executable,
                    str(settings.BASE_DIR / "manage.py"),
                    "run_worker",
                    "--automation",
                    slug,
                ],
                cwd=settings.BASE_DIR,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                pass_fds=(lock,),
                start_new_session=True,  # a machine of its own: our signals are not its
            )
        finally:
            log.close()
        (directory / f"{slug}.pid").write_text(str(process.pid))

    def power_off(self, worker) -> None:
        pid = self._pid(worker.automation.slug)
        if pid is not None and self.state(worker) == MachineState.RUNNING:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def state(self, worker) -> MachineState:
        path = machines_dir() / f"{worker.automation.slug}.lock"
        if not path.exists():
            return MachineState.STOPPED
        lock = os.open(path, os.O_RDWR)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return MachineState.RUNNING
        else:
            fcntl.flock(lock, fcntl.LOCK_UN)
            return MachineState.STOPPED
        finally:
            os.close(lock)

    def _pid(self, slug: str) -> int | None:
        try:
            return int((machines_dir() / f"{slug}.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None


def machines_dir() -> Path:
    directory = Path(settings.LOCAL_MACHINES_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
