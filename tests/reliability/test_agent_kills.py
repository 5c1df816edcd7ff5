"""Scenario 7: an automation's worker killed mid-job, as a machine that dies would be.

The worker and the command it runs are SIGKILLed while a job runs. The stuck-job monitor
settles the job (``worker_lost``, or back to pending while attempts remain) within one
lease plus one monitor cycle; no job is left ``running``.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import time

import pytest
import requests

from tests.reliability.support import Figures, process_tree, scaled, seed, wait_for

KILLS = scaled(3, 10)
LEASE = 5  # JOB_LEASE_SECONDS (its minimum): heartbeats every third of it
MONITOR_INTERVAL = 1.0
# A process that is scheduled late on a busy machine, and the poll's own period.
SLACK = 3.0
WORK = [sys.executable, "-c", "import time; time.sleep(60)"]


def kill_machine(pid: int) -> None:
    """The worker and everything under it (its command runs in a session of its own)."""
    for member in process_tree(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(member, signal.SIGKILL)


@pytest.mark.timeout(scaled(300, 600))
def test_an_automation_worker_killed_mid_job_leaves_no_job_running(
    scenario_database, make_stack, figures
):
    stack = make_stack(
        database_url=scenario_database,
        JOB_LEASE_SECONDS=LEASE,
        MONITOR_PENDING_SECONDS=3600,  # no power-on: the test starts the worker itself
    )
    db = stack.database
    seeded = seed(stack, command=WORK, max_concurrency=1, max_attempts=2)
    stack.api(workers=2)
    stack.monitor(interval=MONITOR_INTERVAL)
    rng = random.Random()
    settle_times: list[float] = []
    outcomes: list[str] = []
    try:
        for _ in range(KILLS):
            if not db.value("SELECT count(*) FROM jobs WHERE status = 'pending'"):
                response = requests.post(
                    f"{stack.api_url}/api/v1/jobs",
                    json={"automation": seeded.automation_id, "params": {}},
                    headers={"Authorization": f"Bearer {seeded.token}"},
                    timeout=30,
                )
                assert response.status_code == 201, response.text
            agent = stack.agent(seeded.slug, seeded.credential)
            job_id, attempt = wait_for(
                lambda: db.rows("SELECT id, attempt FROM jobs WHERE status = 'running'"),
                timeout=60,
                what=lambda: f"a running job\n{stack.log_tail()}",
            )[0]
            time.sleep(rng.uniform(0.5, 2.5))
            kill_machine(agent.pid)
            killed_at = time.monotonic()
            agent.wait(timeout=10)
            status, _ = wait_for(
                lambda job_id=job_id, attempt=attempt: next(
                    (
                        (s, a)
                        for s, a in db.rows(
                            "SELECT status, attempt FROM jobs WHERE id = %s", [job_id]
                        )
                        if s != "running" or a != attempt
                    ),
                    None,
                ),
                timeout=LEASE + MONITOR_INTERVAL + 30,
                what=lambda job_id=job_id: (
                    f"job {job_id} to be settled\n{stack.log_tail('monitor')}"
                ),
                every=0.05,
            )
            settle_times.append(time.monotonic() - killed_at)
            outcomes.append(status)
        jobs = db.rows("SELECT status, failure_reason, attempt FROM jobs")
    finally:
        stack.close()

    failed = [row for row in jobs if row[0] == "failed"]
    figures(
        Figures(
            "7 automation worker SIGKILL",
            sent=len(jobs),
            delivered=len(jobs),
            duplicates=0,
            lost=sum(1 for row in jobs if row[0] == "running"),
            recovery_seconds=max(settle_times),
            extra={
                "kills": len(settle_times),
                "requeued": outcomes.count("pending"),
                "worker_lost": sum(1 for row in failed if row[1] == "worker_lost"),
                "settle_bound_s": LEASE + MONITOR_INTERVAL,
            },
        )
    )
    assert all(row[0] in ("pending", "failed") for row in jobs), jobs
    assert all(row[1] == "worker_lost" for row in failed), failed
    assert "pending" in outcomes and failed, "both settlements happen with two attempts"
    assert max(settle_times) <= LEASE + MONITOR_INTERVAL + SLACK, settle_times
