"""Scenario 6b and 6c: the runs a worker claimed ahead of its slots, when it dies.

6b: a worker SIGKILLed with its window full, beside another under load: its runs claimed
ahead and not started run on the other within seconds (not a lease later), nothing is
lost, and nothing runs twice but what was running in it.

6c: the same window given back again and again, by more SIGKILLs and SIGTERMs than the
broker's delivery limit allows returns: every run is done all the same, and nothing
reaches the dead-letter queue. Each return counts towards the limit; a message the broker
dead-lettered while its run was claimed would leave that run ``running`` with nothing to
move it (every run not finished must keep a way forward: a message, a due outbox row, a
lease that a copy will take over).
"""

from __future__ import annotations

import random
import signal

import pika
import pytest

from tests.reliability import tasks
from tests.reliability.support import (
    Figures,
    Stack,
    dispatch_effects,
    scaled,
    wait_for,
)

CONCURRENCY = 4
# The window of a worker: 16 messages per slot (``WORKER_PREFETCH_PER_SLOT``'s default).
WINDOW_PER_SLOT = 16


def way_forward_report(stack: Stack) -> str:
    """What holds up the runs that did not finish: each one's row and outbox row, and what
    the queue and its dead-letter queue hold (shown when a scenario gives up waiting)."""
    db = stack.database
    lines = ["run, status, receives, holder, lease left s, row unsent, row due in s, executions"]
    lines += [
        repr(row)
        for row in db.rows(
            "SELECT r.run_id::text, r.status, r.receive_count, r.lease_holder,"
            "       extract(epoch FROM r.lease_expires_at - clock_timestamp())::float8,"
            "       o.sent_at IS NULL,"
            "       extract(epoch FROM o.available_at - clock_timestamp())::float8,"
            "       (SELECT count(*) FROM reliability_executions e WHERE e.run_id = r.run_id)"
            "  FROM task_runs r LEFT JOIN platform_outbox_messages o ON o.run_id = r.run_id"
            " WHERE r.task = 'chaos.effect' AND r.status <> 'succeeded' LIMIT 20"
        )
    ]
    lines.append(f"ready: {ready_messages(stack)}, dead-lettered: {dead_lettered(stack)}")
    return "\n".join(lines)


def _queue_count(stack: Stack, queue: str) -> int:
    connection = pika.BlockingConnection(pika.URLParameters(stack.rabbitmq_url))
    try:
        declared = connection.channel().queue_declare(f"{stack.queue_prefix}{queue}", passive=True)
        return declared.method.message_count
    finally:
        connection.close()


def ready_messages(stack: Stack) -> int:
    return _queue_count(stack, "default")


def dead_lettered(stack: Stack) -> int:
    """How many messages the default queue's dead-letter queue holds (none is failed on
    purpose here: any is a message the broker's redrive took)."""
    return _queue_count(stack, "default-dlq")


def _held_by(db, pid: int) -> int:
    return db.value(
        "SELECT count(*) FROM task_runs WHERE status = 'running' AND lease_holder LIKE %s",
        [f"%:{pid}:%"],
    )


def _executed_by(db, pid: int) -> int:
    return db.value("SELECT count(*) FROM reliability_executions WHERE pid = %s", [pid])


WINDOW_RUNS = scaled(600, 3_000)
# The full lease (the queue's visibility): what a run that was running waits after a crash.
FULL_LEASE = 20
# A crashed worker's runs claimed ahead and not started must run elsewhere within this.
TAKEN_UP_WITHIN = 10.0


@pytest.mark.timeout(scaled(240, 900))
def test_a_worker_killed_with_its_window_full_has_its_unstarted_runs_run_elsewhere_in_seconds(
    scenario_database, make_stack, figures
):
    stack = make_stack(
        database_url=scenario_database,
        WORKER_VISIBILITY_TIMEOUT=FULL_LEASE,
        WORKER_RABBITMQ_HEARTBEAT=5,
    )
    db = stack.database
    db.execute(tasks.TABLES)
    rng = random.Random()
    payloads = [{"sleep": round(rng.uniform(0.02, 0.1), 3)} for _ in range(WINDOW_RUNS)]
    run_ids = dispatch_effects(stack, payloads)
    stack.relay()
    worker_args = ("--queues", "default", "--concurrency", str(CONCURRENCY))
    window = CONCURRENCY * WINDOW_PER_SLOT
    try:
        victim = stack.worker(*worker_args, name="victim")
        # Under load: the victim's window full and running, another worker beside it.
        wait_for(
            lambda: (
                _held_by(db, victim.pid) >= window - CONCURRENCY and _executed_by(db, victim.pid)
            ),
            timeout=60,
            what=lambda: f"the victim's window to fill\n{stack.log_tail('victim', 'relay')}",
        )
        survivor = stack.worker(*worker_args, name="survivor")
        wait_for(
            lambda: _executed_by(db, survivor.pid),
            timeout=60,
            what=lambda: f"the other worker to run tasks\n{stack.log_tail('survivor')}",
        )
        stack.signal("victim", signal.SIGKILL)
        victim.wait(timeout=30)
        killed_at = db.now()
        # What the dead worker held, and which of it it had started.
        held = {
            run_id
            for (run_id,) in db.rows(
                "SELECT run_id::text FROM task_runs WHERE status = 'running'"
                " AND lease_holder LIKE %s",
                [f"%:{victim.pid}:%"],
            )
        }
        started = {
            run_id
            for (run_id,) in db.rows(
                "SELECT DISTINCT run_id::text FROM reliability_executions WHERE pid = %s",
                [victim.pid],
            )
        } & held
        unstarted = held - started
        wait_for(
            lambda: (
                db.value(
                    "SELECT count(*) FROM task_runs WHERE task = 'chaos.effect'"
                    " AND status = 'succeeded'"
                )
                == WINDOW_RUNS
            ),
            timeout=scaled(180, 600),
            what=lambda: (
                f"every run to succeed\n{way_forward_report(stack)}\n"
                f"{stack.log_tail('survivor', 'relay')}"
            ),
        )
        dead = dead_lettered(stack)
    finally:
        stack.close()

    def taken_up(runs: set[str]) -> list[float]:
        """Seconds from the kill to each run's first execution elsewhere."""
        if not runs:
            return []
        return sorted(
            seconds
            for (seconds,) in db.rows(
                "SELECT extract(epoch FROM min(started_at) - %s)::float8"
                "  FROM reliability_executions"
                " WHERE run_id = ANY(%s::uuid[]) AND pid <> %s GROUP BY run_id",
                [killed_at, list(runs), victim.pid],
            )
        )

    unstarted_after = taken_up(unstarted)
    started_after = taken_up(started)
    effects = dict(db.rows("SELECT run_id::text, applications FROM reliability_effects"))
    executions = db.value("SELECT count(*) FROM reliability_executions")
    lost = set(run_ids) - set(effects)
    reapplied = sum(count - 1 for count in effects.values())
    figures(
        Figures(
            "6b worker SIGKILL, window full",
            sent=WINDOW_RUNS,
            delivered=len(effects),
            duplicates=reapplied,
            lost=len(lost),
            recovery_seconds=max(unstarted_after, default=0.0),
            extra={
                "held_at_kill": len(held),
                "running_at_kill": len(started),
                "unstarted_taken_up_p50_s": (
                    unstarted_after[len(unstarted_after) // 2] if unstarted_after else 0.0
                ),
                "unstarted_taken_up_max_s": max(unstarted_after, default=0.0),
                "running_taken_up_min_s": min(started_after, default=0.0),
                "full_lease_s": FULL_LEASE,
                "re_executions": executions - WINDOW_RUNS,
                "dead_lettered": dead,
            },
        )
    )
    assert not lost and dead == 0
    # The window was full, and most of it not started yet.
    assert len(held) <= window and len(unstarted) >= window // 2, (len(held), len(started))
    assert len(unstarted_after) == len(unstarted)
    assert max(unstarted_after) <= TAKEN_UP_WITHIN, unstarted_after
    # Only what the dead worker had started ran twice, and its effect was counted once more
    # at most (the crash may have come between its effect and its success). Started: in a
    # slot at the kill, or returned from its handler with its success still waiting for the
    # group commit that follows (so more than the slots, at times: 5 of 4 under load).
    assert executions - WINDOW_RUNS <= len(started)
    assert reapplied <= len(started)


RETURNED_RUNS = scaled(120, 400)
# Each stop returns the worker's window: more stops than the broker's delivery limit
# allows returns of one message (six), alternating SIGKILL and SIGTERM.
STOPS = scaled(10, 24)
SLOT_SECONDS = 0.3


@pytest.mark.timeout(scaled(300, 900))
def test_a_window_given_back_more_often_than_the_delivery_limit_loses_no_run(
    scenario_database, make_stack, figures
):
    stack = make_stack(
        database_url=scenario_database,
        WORKER_VISIBILITY_TIMEOUT=3,
        WORKER_HEARTBEAT_INTERVAL=1,
        WORKER_RABBITMQ_HEARTBEAT=5,
        WORKER_STOP_BUDGET=1,
    )
    db = stack.database
    db.execute(tasks.TABLES)
    # Slow enough that one worker's life runs only the first few of its window: the same
    # messages, at the head of the queue, are given back stop after stop.
    run_ids = dispatch_effects(stack, [{"sleep": SLOT_SECONDS}] * RETURNED_RUNS)
    stack.relay()
    worker_args = ("--queues", "default", "--concurrency", "1")
    kills = terms = 0
    try:
        for signum in [signal.SIGKILL, signal.SIGTERM] * (STOPS // 2):
            process = stack.worker(*worker_args)
            wait_for(
                lambda pid=process.pid: (
                    _held_by(db, pid) >= WINDOW_PER_SLOT // 2 and _executed_by(db, pid)
                ),
                timeout=60,
                what=lambda: f"the worker's window to fill\n{stack.log_tail('worker', 'relay')}",
            )
            stack.signal("worker", signum)
            process.wait(timeout=60)
            kills += signum == signal.SIGKILL
            terms += signum == signal.SIGTERM
        stack.worker("--queues", "default", "--concurrency", str(CONCURRENCY))
        wait_for(
            lambda: (
                db.value(
                    "SELECT count(*) FROM task_runs WHERE task = 'chaos.effect'"
                    " AND status = 'succeeded'"
                )
                == RETURNED_RUNS
            ),
            timeout=scaled(180, 600),
            what=lambda: (
                f"every run to succeed\n{way_forward_report(stack)}\n"
                f"{stack.log_tail('worker', 'relay')}"
            ),
        )
        dead = dead_lettered(stack)
        renewed = stack.log_tail("worker", chars=10**7).count("near its last delivery")
    finally:
        stack.close()

    effects = dict(db.rows("SELECT run_id::text, applications FROM reliability_effects"))
    executions = db.value("SELECT count(*) FROM reliability_executions")
    lost = set(run_ids) - set(effects)
    reapplied = sum(count - 1 for count in effects.values())
    figures(
        Figures(
            "6c worker windows given back past the delivery limit",
            sent=RETURNED_RUNS,
            delivered=len(effects),
            duplicates=reapplied,
            lost=len(lost),
            recovery_seconds=0.0,
            extra={
                "sigkills": kills,
                "sigterms": terms,
                "renewed_copies": renewed,
                "dead_lettered": dead,
                "re_executions": executions - RETURNED_RUNS,
            },
        )
    )
    assert not lost and dead == 0
    # The scenario did what it is for: messages came back near their last delivery.
    assert renewed > 0
    # Only what was running at a stop ran again (one slot per stop).
    assert executions - RETURNED_RUNS <= kills + terms
    assert reapplied <= kills
