"""The ``local`` provider: the automation's worker as a detached process on this computer.

Only one worker process runs per automation. The provider takes an exclusive ``flock``
on ``<LOCAL_MACHINES_DIR>/<slug>.lock`` and hands that very lock to the process it starts
(an inherited file descriptor), so the lock is held exactly as long as the worker lives:
a crash releases it, and two concurrent power-ons cannot both start one.

A restart sends SIGTERM to the worker (its pid file names it), waits for the lock to be
let go (the worker's stop budget, then SIGKILL), and powers on with a fresh credential.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from django.conf import settings

from automation.machines.base import MachineBusy, MachineProvider, MachineState, PowerOn

LOCK_FD_ENV = "HUBDOMMED_MACHINE_LOCK_FD"
# After SIGTERM, a worker lets running commands finish within its stop budget, then stops
# them (KILL_GRACE_SECONDS of the executor): this much more before it is killed.
STOP_MARGIN_SECONDS = 10.0


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

    def restart(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        if self.state(worker) == MachineState.RUNNING:
            pid = self._worker_pid(worker.automation.slug)
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            patience = settings.WORKER_STOP_BUDGET + STOP_MARGIN_SECONDS
            if not self._wait_stopped(worker, patience) and pid is not None:
                # Hung: its own session, so its process group is its pid.
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            if not self._wait_stopped(worker, 5.0):
                raise MachineBusy(f"the worker of {worker.automation.slug} would not stop")
        return self.power_on(worker, issue_credential=issue_credential)

    def _wait_stopped(self, worker, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while self.state(worker) == MachineState.RUNNING:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.1)
        return True

    def power_off(self, worker) -> None:
        pid = self._worker_pid(worker.automation.slug)
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

    def _worker_pid(self, slug: str) -> int | None:
        """The pid in the pid file, if that process is still a worker (pids get reused)."""
        try:
            pid = int((machines_dir() / f"{slug}.pid").read_text())
        except (FileNotFoundError, ValueError):
            return None
        if not Path("/proc/self").exists():
            return pid  # no process table to look in: trust the file
        try:
            command = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return None
        return pid if b"run_worker" in command else None


def machines_dir() -> Path:
    directory = Path(settings.LOCAL_MACHINES_DIR)
    directory.mkdir(parents=True, exist_ok=True)
    return directory
