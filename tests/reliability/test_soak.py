"""Scenario 8: a 30-minute soak (``make chaos`` only).

Steady API traffic through the whole system: the API (gunicorn), the relay, the
background worker (which powers the automation's machine on), the automation's worker
that runs each job, and the stuck-job monitor. Every 15 s the resident memory of each
process and the outbox's lag are sampled. Bounds: after a two-minute warm-up no process
grows by more than ``RSS_GROWTH_BOUND``; the oldest due row never waits more than
``LAG_BOUND``; every job the API accepted succeeds.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from tests.reliability.support import (
    FULL,
    Figures,
    JobTraffic,
    LagProbe,
    process_tree,
    rss_kib,
    seed,
    wait_for,
)

MINUTES = float(os.environ.get("CHAOS_SOAK_MINUTES", "30"))
RATE = 5.0  # jobs per second
SAMPLE_EVERY = 15.0
WARM_UP = min(120.0, MINUTES * 60 / 4)
RSS_GROWTH_BOUND = 32 * 1024  # KiB per process (gunicorn: master and workers together)
LAG_BOUND = 5.0  # seconds

pytestmark = pytest.mark.skipif(not FULL, reason="the soak runs in `make chaos` (CHAOS=full)")


@pytest.mark.timeout(int(MINUTES * 60) + 600)
def test_soak_under_steady_traffic_memory_and_lag_stay_bounded(
    scenario_database, make_stack, figures, tmp_path
):
    stack = make_stack(database_url=scenario_database, MONITOR_INTERVAL_SECONDS="5")
    seeded = seed(stack, command=["/bin/true"], max_concurrency=4)
    stack.api(workers=3)
    stack.env["HUB_URL"] = stack.api_url
    stack.relay()
    stack.worker("--queues", "critical,default,maintenance", "--concurrency", "4")
    stack.monitor(interval=5.0)
    traffic = JobTraffic(stack.api_url, seeded, threads=2, rate=RATE).start()
    samples: list[dict] = []
    lag = LagProbe(stack, every=0.5)
    pid_file = stack.machines / f"{seeded.slug}.pid"
    try:
        wait_for(
            pid_file.exists, timeout=120, what=lambda: f"the machine to start\n{stack.log_tail()}"
        )
        agent = int(pid_file.read_text())
        lag.start()
        started = time.monotonic()
        while time.monotonic() - started < MINUTES * 60:
            sample = {
                "t": round(time.monotonic() - started, 1),
                "lag_s": max(lag.samples[-int(SAMPLE_EVERY / 0.5) :], default=0.0),
                "jobs_waiting": stack.database.value(
                    "SELECT count(*) FROM jobs WHERE status IN ('pending', 'running')"
                ),
                "api": stack.rss_kib("api"),
                "relay": stack.rss_kib("relay"),
                # Alone: the machines it powers on are its children too.
                "worker": stack.rss_kib("worker", children=False),
                "monitor": stack.rss_kib("monitor"),
                "agent": sum(rss_kib(pid) for pid in process_tree(agent)),
            }
            samples.append(sample)
            dead = [n for n in ("api", "relay", "worker", "monitor") if not stack.alive(n)]
            assert not dead, f"{dead} died\n{stack.log_tail()}"
            time.sleep(SAMPLE_EVERY)
        lag.stop()
        traffic.stop()
        stopped = time.monotonic()
        wait_for(
            lambda: (
                stack.database.value("SELECT count(*) FROM jobs WHERE status = 'succeeded'")
                >= traffic.created
            ),
            timeout=300,
            what=lambda: f"every job to succeed\n{stack.log_tail()}",
        )
        drained = time.monotonic() - stopped
        statuses = dict(stack.database.rows("SELECT status, count(*) FROM jobs GROUP BY 1"))
    finally:
        lag.stop()
        traffic.stop()
        (tmp_path / "soak-samples.json").write_text(json.dumps(samples, indent=1))
        stack.close()

    processes = ("api", "relay", "worker", "monitor", "agent")
    warm = [s for s in samples if s["t"] >= WARM_UP]
    baseline = {name: warm[0][name] for name in processes}
    peak = {name: max(s[name] for s in warm) for name in processes}
    growth = {name: peak[name] - baseline[name] for name in processes}
    worst_lag = lag.worst
    figures(
        Figures(
            "8 soak",
            sent=traffic.sent,
            delivered=statuses.get("succeeded", 0),
            duplicates=0,
            lost=traffic.created - statuses.get("succeeded", 0),
            recovery_seconds=drained,
            extra={
                "minutes": MINUTES,
                "rate_per_s": RATE,
                "lag_max_s": worst_lag,
                "jobs_waiting_max": max(s["jobs_waiting"] for s in samples),
                **{
                    f"rss_{n}_mib": f"{baseline[n] / 1024:.0f}->{peak[n] / 1024:.0f}"
                    for n in processes
                },
            },
        )
    )
    assert traffic.statuses == {201: traffic.sent}, traffic.failures[:5]
    assert statuses.get("succeeded", 0) == traffic.created, statuses
    assert worst_lag <= LAG_BOUND, worst_lag
    assert all(g <= RSS_GROWTH_BOUND for g in growth.values()), growth
