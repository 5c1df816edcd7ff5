"""Scenario 1: the relay SIGKILLed at random moments while jobs are created through the API.

Every ``JobCreated`` (two messages: the power-on and the automation's own queue) reaches
the broker; nothing is lost; the copies a kill between the broker's confirm and the
relay's commit causes are counted.
"""

from __future__ import annotations

import random
import signal
import time

import pytest

from tests.reliability.support import (
    BrokerAudit,
    Figures,
    JobTraffic,
    job_queues,
    scaled,
    seed,
    wait_for,
)

JOBS = scaled(1_000, 10_000)
KILLS = scaled(4, 12)


def kill_points(rng: random.Random) -> list[int]:
    """After how many requests each kill comes: one at a random point of each of KILLS
    equal stretches of the traffic, the last stretch left for after the last kill."""
    stretch = JOBS // (KILLS + 1)
    return [i * stretch + rng.randrange(stretch // 5, stretch) for i in range(KILLS)]


@pytest.mark.timeout(scaled(300, 1800))
def test_relay_killed_at_random_moments_loses_no_job_created(
    scenario_database, make_stack, figures
):
    stack = make_stack(database_url=scenario_database)
    seeded = seed(stack)
    stack.api(workers=3)
    # Small batches: a kill lands mid-batch (claimed, published, not yet committed) often.
    stack.relay(RELAY_BATCH_SIZE="100")
    audit = BrokerAudit(stack.rabbitmq_url, job_queues(stack, seeded.automation_id)).start()
    try:
        traffic = JobTraffic(stack.api_url, seeded, threads=6, total=JOBS)
        rng = random.Random()
        points = kill_points(rng)
        # However fast the API answers, the traffic waits a little past each kill's point
        # until that kill is done: every kill lands while jobs are being created.
        traffic.hold_after(points[0] + JOBS // (4 * (KILLS + 1)))
        traffic.start()
        kills: list[float] = []
        recoveries: list[float] = []
        kills_while_creating = 0
        for number, point in enumerate(points):
            traffic.wait_sent(point, timeout=scaled(120, 900))
            stack.signal("relay", signal.SIGKILL)
            stack.processes["relay"].wait(timeout=10)
            kills.append(time.monotonic())
            kills_while_creating += not traffic.done()
            restarted_at, moment = time.monotonic(), stack.database.now()
            stack.relay(RELAY_BATCH_SIZE="100")
            if stack.database.pending_rows():
                # Recovered: the new relay marked something sent.
                wait_for(
                    lambda moment=moment: stack.database.sent_since(moment),
                    timeout=30,
                    what=lambda: f"the restarted relay to deliver\n{stack.log_tail('relay')}",
                )
                recoveries.append(time.monotonic() - restarted_at)
            later = points[number + 1] if number + 1 < KILLS else None
            traffic.hold_after(later + JOBS // (4 * (KILLS + 1)) if later else None)
        traffic.join(timeout=scaled(240, 1500))
        creation_done = time.monotonic()

        expected = stack.database.job_created_run_ids()
        last = audit.wait_for(
            expected,
            timeout=120,
            what=lambda: f"every JobCreated on the broker\n{stack.log_tail()}",
        )
        wait_for(lambda: stack.database.pending_rows() == 0, timeout=30, what="no pending row")
    finally:
        audit.stop()
        stack.close()

    # The API answered every request; each job has its two messages.
    assert traffic.statuses == {201: JOBS}, traffic.failures[:5]
    assert len(expected) == 2 * JOBS
    lost = expected - audit.seen
    figures(
        Figures(
            "1 relay SIGKILL",
            sent=len(expected),
            delivered=len(expected & audit.seen),
            duplicates=audit.duplicates(),
            lost=len(lost),
            recovery_seconds=max(recoveries, default=0.0),
            extra={
                "jobs": JOBS,
                "kills": len(kills),
                "kills_while_creating": kills_while_creating,
                "drain_after_last_request_s": max(0.0, last - creation_done),
                "redelivered_by_broker": audit.redelivered,
            },
        )
    )
    assert not lost
    assert kills_while_creating >= min(KILLS, 3), "the kills came after the traffic"
