"""A SIGTERM at any moment of a daemon's life, its start-up included, is a clean exit 0.

Each of the four daemons is started as a real process and signalled at a moment of its
start-up: as soon as it catches SIGTERM at all (what ``manage.py`` installs before it
imports Django), half a second, one and two seconds after that (Django's set-up, the
daemon's imports, its first connections), and at its first line of output.

Before ``manage.py`` runs its first line the interpreter itself is starting (some tens of
milliseconds, more than half a second on a loaded machine): no Python handler can exist
yet, so that window is the operating system's, and the moments count from its end.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import process_environment

pytestmark = pytest.mark.django_db(transaction=True)

DAEMONS = {
    "run_relay": ["run_relay"],
    "run_scheduler": ["run_scheduler", "--interval", "3600"],
    "watch_stuck_jobs": ["watch_stuck_jobs", "--interval", "3600"],
    "run_worker": ["run_worker", "--queues", "maintenance", "--concurrency", "1"],
    # An automation's worker whose hub does not answer yet: it waits for it, and a stop
    # then is as clean as any other.
    "run_worker --automation": ["run_worker", "--automation", "nightly-report"],
}


def closed_port() -> int:
    # A port nothing listens on (below the ephemeral range: no outgoing connection takes it).
    return free_port()


# When the signal is sent: as soon as the process catches it, seconds after that, or at its
# first line of output.
MOMENTS = ["handler installed", "0.5", "1", "2", "first output"]


def catches_sigterm(pid: int) -> bool:
    """The kernel's word on whether the process has a handler for SIGTERM (not the default
    action, which would kill it)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    except FileNotFoundError:
        return False
    return False


@pytest.mark.parametrize("moment", MOMENTS)
@pytest.mark.parametrize("daemon", list(DAEMONS))
def test_a_sigterm_during_start_up_is_a_clean_exit_0(settings, daemon, moment):
    process = subprocess.Popen(
        [sys.executable, "manage.py", *DAEMONS[daemon]],
        cwd=django_settings.BASE_DIR,
        env=process_environment(
            settings,
            HUBDOMMED_RELAY="true",
            LOG_LEVEL="info",
            WORKER_STOP_BUDGET="5",
            HUB_URL=f"http://127.0.0.1:{closed_port()}",
            HUBDOMMED_WORKER_CREDENTIAL="a-credential-no-hub-will-check",
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        if moment == "first output":
            first = process.stderr.readline()
            assert first, f"{daemon} ended before it wrote anything"
        else:
            wait_until(
                lambda: catches_sigterm(process.pid) or process.poll() is not None,
                timeout=30,
                interval=0.001,
                message=f"{daemon} to catch SIGTERM",
            )
            if moment != "handler installed":
                # A moment of the start-up, whatever the daemon is doing then.
                time.sleep(float(moment))
        assert process.poll() is None, f"{daemon} ended before it was signalled"
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()

    assert process.returncode == 0, f"{daemon} at {moment}: exit {process.returncode}\n{err}"
    assert "stopped" in out, out
