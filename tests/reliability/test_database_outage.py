"""Scenario 4: PostgreSQL restarted, and its backends terminated, under the whole system.

A private PostgreSQL cluster holds the database of the API (gunicorn), the relay, the
background worker (which powers the automation's machine on: a local worker process that
runs the jobs over HTTP) and the stuck-job monitor. The database goes away while they are
idle, and again while jobs stream in; each of them must carry on by itself, and every job
the API accepted must run to its end.
"""

from __future__ import annotations

import time

import pytest
import requests

from tests.reliability import tasks
from tests.reliability.support import (
    Figures,
    JobTraffic,
    dispatch_effects,
    scaled,
    seed,
    wait_for,
)

LEASE = 10  # JOB_LEASE_SECONDS: the agent heartbeats every third of it


def create_job(stack, seeded) -> int:
    """One job through the API; the first answer must be a 201."""
    response = requests.post(
        f"{stack.api_url}/api/v1/jobs",
        json={"automation": seeded.automation_id, "params": {"probe": True}},
        headers={"Authorization": f"Bearer {seeded.token}"},
        timeout=30,
    )
    assert response.status_code == 201, response.text[:500]
    return response.json()["id"]


def job_done(stack, job_id: int) -> bool:
    return stack.database.value("SELECT status FROM jobs WHERE id = %s", [job_id]) == "succeeded"


def effect_done(stack) -> float:
    """A run of the scenarios' task through relay and worker; seconds until its effect."""
    started = time.monotonic()
    (run_id,) = dispatch_effects(stack, [{"sleep": 0}])
    wait_for(
        lambda: stack.database.value(
            "SELECT count(*) FROM reliability_effects WHERE run_id = %s", [run_id]
        ),
        timeout=60,
        what=lambda: f"the worker to run a task\n{stack.log_tail('worker', 'relay')}",
    )
    return time.monotonic() - started


def monitor_cycles(stack) -> list[str]:
    return [
        line
        for line in (stack.logs / "monitor.log").read_text(errors="replace").splitlines()
        if "monitor cycle:" in line
    ]


@pytest.mark.timeout(scaled(300, 600))
def test_database_restarted_and_backends_terminated_everything_recovers_by_itself(
    private_postgres, migrated_database, make_stack, figures
):
    pg = private_postgres
    stack = make_stack(
        database_url=pg.url(migrated_database),
        JOB_LEASE_SECONDS=LEASE,
        AGENT_POLL_INTERVAL="0.5",
        AGENT_IDLE_TIMEOUT="0",
    )
    stack.database.execute(tasks.TABLES)
    seeded = seed(stack, command=["/bin/true"], max_concurrency=4, max_attempts=3)
    stack.api(workers=3)
    stack.env["HUB_URL"] = stack.api_url
    stack.relay()
    stack.worker("--queues", "critical,default", "--concurrency", "4")
    stack.monitor(interval=1.0)
    recoveries: dict[str, float] = {}
    traffic = JobTraffic(stack.api_url, seeded, threads=4, rate=10.0)
    try:
        # Warm: a first job runs end to end (it powers the machine on).
        first = create_job(stack, seeded)
        wait_for(
            lambda: job_done(stack, first),
            timeout=90,
            what=lambda: f"the first job\n{stack.log_tail()}",
        )
        effect_done(stack)

        # 1. Idle: nothing is happening when the database restarts, then when it drops
        # every connection. The next job and the next task go through by themselves.
        for name, outage in (
            ("idle restart", pg.restart),
            ("idle terminate", lambda: pg.terminate_backends(migrated_database)),
        ):
            time.sleep(3)  # every daemon back to waiting
            outage()
            started = time.monotonic()
            job_id = create_job(stack, seeded)
            wait_for(
                lambda job_id=job_id: job_done(stack, job_id),
                timeout=60,
                what=lambda name=name: f"a job after the {name}\n{stack.log_tail()}",
            )
            effect_done(stack)
            recoveries[name] = time.monotonic() - started

        # 2. Busy: jobs stream in while the database restarts, and drops its connections.
        cycles_before = len(monitor_cycles(stack))
        traffic.start()
        time.sleep(3)
        pg.restart()
        restarted = time.monotonic()
        time.sleep(3)
        dropped = pg.terminate_backends(migrated_database)
        time.sleep(3)
        traffic.stop()
        effect_done(stack)
        created = [first, *traffic.job_ids]
        wait_for(
            lambda: (
                stack.database.value(
                    "SELECT count(*) FROM jobs WHERE status = 'succeeded' AND id = ANY(%s)",
                    [created],
                )
                == len(created)
            ),
            timeout=scaled(120, 240),
            what=lambda: f"every accepted job to succeed\n{stack.log_tail()}",
        )
        recoveries["busy"] = time.monotonic() - restarted
        # Nothing due is left unsent. (A run the worker could not mark done while the
        # database was away comes back later, by design: its row waits for its lease.)
        wait_for(
            lambda: stack.database.oldest_pending_age() < 2.0,
            timeout=30,
            what=lambda: f"the relay to keep up\n{stack.log_tail('relay')}",
        )
        wait_for(
            lambda: len(monitor_cycles(stack)) > cycles_before + 3,
            timeout=30,
            what="the monitor to keep cycling",
        )
        alive = {name: stack.alive(name) for name in ("api", "relay", "worker", "monitor")}
        last_cycle = monitor_cycles(stack)[-1]
        statuses = dict(stack.database.rows("SELECT status, count(*) FROM jobs GROUP BY 1"))
        attempts = stack.database.value("SELECT max(attempt) FROM jobs")
    finally:
        traffic.stop()
        stack.close()

    refused = traffic.sent - traffic.created
    figures(
        Figures(
            "4 PostgreSQL restart and terminated backends",
            sent=len(created),
            delivered=statuses.get("succeeded", 0) - 2,  # less the two idle probes
            duplicates=0,
            lost=len(created) - (statuses.get("succeeded", 0) - 2),
            recovery_seconds=max(recoveries.values()),
            extra={
                **{f"{k.replace(' ', '_')}_s": v for k, v in recoveries.items()},
                "requests_during_busy": traffic.sent,
                "requests_refused_while_down": refused,
                "refusals": ",".join(f"{k}:{v}" for k, v in traffic.statuses.items() if k != 201)
                or "none",
                "backends_terminated": dropped,
                "max_attempt": attempts,
            },
        )
    )
    assert alive == dict.fromkeys(alive, True), stack.log_tail()
    assert "0 step errors" in last_cycle, last_cycle
    assert statuses.get("running", 0) == 0 and statuses.get("pending", 0) == 0, statuses
    # While the database is down the API cannot take a job: it says so with a 503 the
    # client may retry (never a 500, a hang or a dropped connection); every job it did
    # accept ran.
    assert set(traffic.statuses) <= {201, 503}, traffic.failures[:5]
