"""Ctrl-C under ``make run``: ``scripts/run.sh`` returns only once the automation workers it
started and the commands they run are gone, and a stop asked for ends in 0 (make prints no
error for it). Once, a running job gets the stop budget to finish; twice, everything stops
at once."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from job.services import job_create
from tests.e2e.conftest import ROOT, job_status
from tests.e2e.test_restarts import Stack, alive
from tests.polling import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class MakeRun(Stack):
    """``make run`` itself: make, then ``scripts/run.sh`` in its place."""

    def start(self) -> None:
        self.starts += 1
        with open(self.logs / f"stack-{self.starts}.log", "ab") as log:
            self.process = subprocess.Popen(
                ["make", "--no-print-directory", "run"],
                cwd=ROOT,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # The parent's pid comes after the name, which may hold spaces: after the last ")".
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def ctrl_c(stack: Stack) -> None:
    """What a terminal's Ctrl-C does: SIGINT to the whole foreground process group."""
    os.killpg(stack.process.pid, signal.SIGINT)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("presses", [1, 2], ids=["once", "twice"])
def test_ctrl_c_stops_the_automation_workers_and_their_commands_before_it_returns(
    settings, broker_names, catalog, person, tmp_path, presses
):
    automation = catalog(f"stopped-{presses}").automation
    # Once through make itself: its exit is the SIGINT it got too (GNU make ends so whatever
    # its recipe did), but it says nothing of an error.
    stack = MakeRun(settings, tmp_path) if presses == 1 else Stack(settings, tmp_path)
    # Once: the worker's stop budget lets the command run 3 s more, then stops it. Twice: a
    # budget far longer than the test, which the second Ctrl-C cuts short.
    stack.env["WORKER_STOP_BUDGET"] = "3" if presses == 1 else "120"
    try:
        stack.start()
        job, _ = job_create(
            tenant=person.tenant,
            automation_id=automation.id,
            params={"name": "Ada", "sleep": 600},
            requested_by=person,
        )
        wait_until(
            lambda: job_status(job.id) == "running",
            timeout=90,
            message=lambda: f"job is {job_status(job.id)}\n{stack.log_text()}",
        )
        worker = stack.worker_pid(automation.slug)
        commands = wait_until(lambda: children_of(worker), timeout=30)

        ctrl_c(stack)
        if presses == 2:
            wait_until(
                lambda: "Ctrl-C again stops them now" in stack.log_text(),
                timeout=60,
                message=stack.log_text,
            )
            ctrl_c(stack)
        started = time.monotonic()
        code = stack.process.wait(timeout=60)
        took = time.monotonic() - started

        if presses == 1:
            assert code == -signal.SIGINT, stack.log_text()
            assert not re.search(r"^make: \*\*\*", stack.log_text(), re.MULTILINE), stack.log_text()
            # The worker kept the job's outcome for its next start and then exited, within
            # the stop budget and the moment its output may wait (the hub is gone by then):
            # it was not killed at the script's deadline, its report unwritten.
            assert "the outcome stays on disk for the next start" in stack.log_text(), (
                stack.log_text()
            )
        else:
            assert code == 0, stack.log_text()
        # Gone when it returned, not some time after.
        assert not alive(worker), stack.log_text()
        assert not any(alive(pid) for pid in commands), stack.log_text()
        if presses == 2:
            assert took < 30, stack.log_text()
    finally:
        stack.cleanup()
