"""One run, one worker at a time: starting a run is an atomic claim, and the holder's
lease (extended by its heartbeat) keeps every other copy of the message from running it."""

from __future__ import annotations

import subprocess
import threading
import time
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.runs import Begin, Lease, RunLedger, Started, requeue_failed_run
from tests.worker.conftest import (
    claim,
    dispatch_work,
    executions,
    go_ahead,
    outcomes,
    run_finished,
    run_of,
    send_again,
    wait_for,
    worker_command,
    worker_environment,
)
from worker.builders import window_for
from worker.leases import AHEAD_LEASE_SECONDS, LeaseKeeper, Start, ahead_seconds

pytestmark = pytest.mark.django_db(transaction=True)


def envelope(run_id: str) -> dict:
    return {"run_id": run_id, "task": "test.work", "queue": "default"}


def claim_at_the_same_moment(run_id: str, claimers: int) -> list[tuple[str, Started]]:
    """Each claimer in its own thread, with its own database connection, released by a
    barrier at once."""
    barrier = threading.Barrier(claimers)
    results: list[tuple[str, Started] | None] = [None] * claimers
    errors: list[BaseException] = []

    def claim_once(number: int) -> None:
        try:
            connection.ensure_connection()
            barrier.wait(timeout=10)
            holder = f"claimer-{number}"
            results[number] = (
                holder,
                claim(RunLedger(), envelope(run_id), holder=holder, lease=30),
            )
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=claim_once, args=(number,)) for number in range(claimers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert not errors, errors
    return [result for result in results if result is not None]


def test_of_eight_workers_claiming_one_run_at_the_same_moment_exactly_one_runs_it():
    for _ in range(10):
        run_id = dispatch_work()

        results = claim_at_the_same_moment(run_id, 8)

        assert Counter(started.decision for _, started in results) == {
            Begin.RUN: 1,
            Begin.BUSY: 7,
        }
        (winner,) = [holder for holder, started in results if started.decision is Begin.RUN]
        run = run_of(run_id)
        assert run.status == TaskRun.Status.RUNNING
        assert run.receive_count == 1
        assert run.lease_holder == winner
        assert all(
            0 < started.lease_remaining <= 30
            for _, started in results
            if started.decision is Begin.BUSY
        )


def test_a_run_held_under_a_live_lease_is_busy_for_another_claimer_and_not_counted_again():
    run_id = dispatch_work()
    ledger = RunLedger()

    first = claim(ledger, envelope(run_id), holder="a", lease=30)
    second = claim(ledger, envelope(run_id), holder="b", lease=30)

    assert (first.decision, first.receive_count) == (Begin.RUN, 1)
    assert second.decision is Begin.BUSY
    assert 25 < second.lease_remaining <= 30
    run = run_of(run_id)
    assert (run.receive_count, run.lease_holder) == (1, "a")


def test_a_run_whose_lease_expired_is_taken_over_by_the_next_claim():
    run_id = dispatch_work()
    ledger = RunLedger()
    claim(ledger, envelope(run_id), holder="dead", lease=30)
    TaskRun.objects.filter(run_id=run_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )

    started = claim(ledger, envelope(run_id), holder="next", lease=30)

    assert (started.decision, started.receive_count) == (Begin.RUN, 2)
    assert run_of(run_id).lease_holder == "next"


def test_a_finished_run_is_skipped_whatever_its_lease_said():
    run_id = dispatch_work()
    ledger = RunLedger()
    claim(ledger, envelope(run_id), holder="a", lease=30)
    ledger.succeeded_many([Lease(run_id, "a", seconds=30, interval=10)])

    started = claim(ledger, envelope(run_id), holder="b", lease=30)

    assert started.decision is Begin.SKIP
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.lease_expires_at is None


def test_the_heartbeat_extends_only_the_leases_its_holder_still_holds():
    run_id = dispatch_work()
    ledger = RunLedger()
    claim(ledger, envelope(run_id), holder="stuck", lease=1)
    TaskRun.objects.filter(run_id=run_id).update(
        lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    claim(ledger, envelope(run_id), holder="next", lease=1)

    lost = ledger.extend([Lease(run_id, "stuck", seconds=600, interval=1)])
    kept = ledger.extend([Lease(run_id, "next", seconds=600, interval=1)])

    assert (lost, kept) == (set(), {"next"})
    run = run_of(run_id)
    assert run.lease_holder == "next"
    assert run.lease_expires_at > timezone.now() + timedelta(seconds=500)


def test_a_run_given_back_at_shutdown_is_free_for_the_next_claim_at_once():
    run_id = dispatch_work()
    ledger = RunLedger()
    claim(ledger, envelope(run_id), holder="stopping", lease=600)

    ledger.requeued(run_id, holder="stopping")
    started = claim(ledger, envelope(run_id), holder="next", lease=600)

    assert (started.decision, started.receive_count) == (Begin.RUN, 2)


def test_an_operator_requeue_leaves_a_succeeded_run_and_a_held_run_alone():
    succeeded, held = dispatch_work(), dispatch_work()
    ledger = RunLedger()
    for run_id in (succeeded, held):
        claim(ledger, envelope(run_id), holder="a", lease=600)
    ledger.succeeded_many([Lease(succeeded, "a", seconds=600, interval=10)])

    assert not requeue_failed_run(succeeded)
    assert not requeue_failed_run(held)
    assert run_of(succeeded).status == TaskRun.Status.SUCCEEDED
    assert run_of(held).status == TaskRun.Status.RUNNING


def _sent(run_id: str) -> bool:
    return PlatformOutboxMessage.objects.get(run_id=run_id).sent_at is not None


def test_two_copies_of_one_message_consumed_at_once_by_two_workers_run_the_handler_once(
    broker, relay, start_workers
):
    run_id = dispatch_work(wait_for_go_ahead=True)
    wait_for(lambda: _sent(run_id), what="the first copy to be sent")
    send_again(run_id)
    # Both copies wait in the queue; two workers start at the same moment, one slot each.
    workers = start_workers(2, concurrency=1)

    wait_for(lambda: outcomes(workers, "busy"), what="one copy to be turned away")
    # The copy turned away may be settled before the claimed one's handler starts.
    wait_for(lambda: len(executions(run_id)) == 1, what="the claimed copy to run")
    go_ahead(run_id)
    wait_for(lambda: run_finished(run_id), what="the run to finish")
    # The copy turned away comes back once the lease is over, and is skipped.
    wait_for(lambda: outcomes(workers, "duplicate"), what="the copy to come back and be skipped")

    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 1
    assert len(executions(run_id)) == 1
    assert outcomes(workers, "succeeded") == 1


def test_a_copy_arriving_after_the_first_lease_would_have_ended_finds_it_extended(
    broker, relay, start_workers
):
    # A lease of 2 s, extended every 0.5 s by the holder's heartbeat.
    workers = start_workers(2, concurrency=1)
    run_id = dispatch_work(wait_for_go_ahead=True)
    wait_for(lambda: executions(run_id), what="the task to start")
    first_expiry = run_of(run_id).lease_expires_at
    wait_for(
        lambda: timezone.now() > first_expiry + timedelta(seconds=1),
        what="the first lease to be over",
    )

    send_again(run_id, wait=False)
    wait_for(lambda: outcomes(workers, "busy"), what="the copy to be turned away")

    assert run_of(run_id).lease_expires_at > first_expiry
    go_ahead(run_id)
    wait_for(lambda: run_finished(run_id), what="the run to finish")
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 1
    assert len(executions(run_id)) == 1
    assert sum(worker.processor.leases.beats for worker in workers) > 0


# -- runs claimed ahead of their slot (RabbitMQ) ----------------------------------------------


def test_a_run_claimed_ahead_is_held_briefly_and_under_its_full_lease_once_started():
    run_id = dispatch_work()
    ledger = RunLedger()
    keeper = LeaseKeeper(ledger)
    full = Lease(run_id, "me", seconds=600, interval=200)
    claimed_at = time.monotonic()
    short = ahead_seconds(full)
    assert claim(ledger, envelope(run_id), holder="me", lease=short).decision is Begin.RUN
    keeper.hold(full, ahead=True, confirmed_at=claimed_at)
    try:
        # Kept alive by the keeper's beats, never further than the short lease ahead.
        beats = keeper.beats
        wait_for(lambda: keeper.beats > beats, what="a beat")
        assert run_of(run_id).lease_expires_at <= timezone.now() + timedelta(seconds=short)
        # Its slot starts it: kept under the full lease from the keeper's next beat.
        assert keeper.start(full) is Start.STARTED
        wait_for(
            lambda: run_of(run_id).lease_expires_at > timezone.now() + timedelta(seconds=500),
            what="the full lease",
        )
    finally:
        keeper.drop(full)


def test_a_slot_does_not_start_a_run_whose_short_lease_no_beat_kept_lately():
    run_id = dispatch_work()
    ledger = RunLedger()
    keeper = LeaseKeeper(ledger)
    full = Lease(run_id, "me", seconds=600, interval=200)
    claim(ledger, envelope(run_id), holder="me", lease=ahead_seconds(full))
    # Confirmed longer ago than its lease lasts (the database was away since, say).
    keeper.hold(full, ahead=True, confirmed_at=time.monotonic() - ahead_seconds(full))
    try:
        assert keeper.start(full) is Start.UNCONFIRMED
        # Confirmed again by the slot itself (its own statement): started.
        assert keeper.start(full, confirmed_at=time.monotonic()) is Start.STARTED
        # A lease let go of (its delivery given back) is not started at all.
        keeper.drop(full)
        assert keeper.start(full) is Start.NOT_HELD
    finally:
        keeper.drop(full)


def _subprocess_worker(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        worker_command("--queues", "default", *args),
        env=worker_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
@pytest.mark.timeout(120)
def test_a_copy_of_a_run_a_live_worker_claimed_ahead_waits_for_it_and_never_runs_it_twice(
    broker, relay, start_worker, settings
):
    settings.WORKER_VISIBILITY_TIMEOUT = 20
    settings.WORKER_HEARTBEAT_INTERVAL = 0
    process = _subprocess_worker("--concurrency", "1")
    try:
        blocker = dispatch_work(wait_for_go_ahead=True)
        wait_for(lambda: executions(blocker), what="the subprocess to start the blocker")
        # Its window full (16 for its one slot): the copy below can only go elsewhere.
        others = [dispatch_work() for _ in range(window_for(1) - 2)]
        run_id = dispatch_work()
        # Claimed ahead in the subprocess, behind the blocker in its only slot.
        wait_for(
            lambda: (
                TaskRun.objects.filter(
                    run_id__in=[*others, run_id], status=TaskRun.Status.RUNNING
                ).count()
                == len(others) + 1
            ),
            what="the subprocess to claim its window ahead",
        )
        send_again(run_id)
        began = time.monotonic()
        worker = start_worker(concurrency=1)
        # The copy waits for the other worker's short lease (put aside, not in a slot),
        # finds it kept (that worker lives), and is given back for later.
        wait_for(lambda: worker.processor.outcomes["busy"], what="the copy to be given back")
        # Not at once: after that lease would have ended (it had one beat left, or less).
        assert time.monotonic() - began >= AHEAD_LEASE_SECONDS - 2.0
        assert executions(run_id) == []
        go_ahead(blocker)
        wait_for(lambda: run_finished(run_id), what="the subprocess to run it")
        wait_for(
            lambda: worker.processor.outcomes["duplicate"],
            what="the copy to come back and be skipped",
        )
        # Settled without a slot, each copy: nothing left behind in the window.
        assert worker.processor.window.prepared == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        process.stderr.close()
    assert len(executions(run_id)) == 1
    assert run_of(run_id).receive_count == 1


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
@pytest.mark.timeout(120)
def test_a_killed_workers_runs_claimed_ahead_run_elsewhere_in_seconds_its_running_one_later(
    broker, relay, start_worker, settings
):
    # A full lease far longer than the seconds a run claimed ahead may wait.
    settings.WORKER_VISIBILITY_TIMEOUT = 20
    settings.WORKER_HEARTBEAT_INTERVAL = 0  # a third of it
    full_lease = 20.0
    process = _subprocess_worker("--concurrency", "1")
    try:
        run_ids = [dispatch_work(wait_for_go_ahead=True) for _ in range(12)]
        # One running in the killed worker's only slot, the others claimed ahead there.
        wait_for(
            lambda: TaskRun.objects.filter(run_id__in=run_ids, status="running").count() == 12,
            what="the subprocess to claim every run",
        )
        wait_for(
            lambda: [run_id for run_id in run_ids if executions(run_id)],
            what="the subprocess to start one",
        )
        (running,) = [run_id for run_id in run_ids if executions(run_id)]
        # Its slot started it: held under the full lease from the keeper's next beat.
        wait_for(
            lambda: (
                run_of(running).lease_expires_at
                > timezone.now() + timedelta(seconds=AHEAD_LEASE_SECONDS + 1)
            ),
            what="the running run's full lease",
        )
        process.kill()
        process.wait(timeout=10)
        killed_at = time.time()
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()
    for run_id in run_ids:
        go_ahead(run_id)
    ahead = [run_id for run_id in run_ids if run_id != running]

    start_worker(concurrency=4)
    wait_for(
        lambda: all(run_finished(run_id) for run_id in ahead),
        what="the runs claimed ahead to run on the other worker",
    )
    taken_up = max(executions(run_id)[0][1] for run_id in ahead) - killed_at
    assert taken_up <= 10.0, f"claimed-ahead runs waited {taken_up:.1f} s after the kill"
    # Each ran once, there; the one that was running has not run again yet: its lease holds.
    assert all(len(executions(run_id)) == 1 for run_id in ahead)
    assert len(executions(running)) == 1

    wait_for(lambda: run_finished(running), timeout=60, what="the running run after its lease")
    _, (_, again) = executions(running)
    # Taken over only once its full lease ended (at most one beat before the kill).
    assert again - killed_at >= full_lease - full_lease / 3 - 0.5
    assert run_of(running).status == TaskRun.Status.SUCCEEDED


@pytest.mark.parametrize("broker", ["sqs"], indirect=True)
def test_on_sqs_a_run_claimed_ahead_is_held_under_its_full_lease(
    broker, relay, start_worker, settings
):
    settings.WORKER_VISIBILITY_TIMEOUT = 30
    settings.WORKER_HEARTBEAT_INTERVAL = 0
    worker = start_worker(concurrency=1)
    blocker = dispatch_work(wait_for_go_ahead=True)
    wait_for(lambda: executions(blocker), what="the blocker to start")
    waiting = dispatch_work()
    wait_for(lambda: run_of(waiting).status == TaskRun.Status.RUNNING, what="a claim ahead")
    # Its message stays invisible for the visibility timeout whatever becomes of the
    # worker: a short lease would free the run for no message to take it.
    assert not worker.processor.ahead
    assert run_of(waiting).lease_expires_at > timezone.now() + timedelta(
        seconds=AHEAD_LEASE_SECONDS * 2
    )
    go_ahead(blocker)
    wait_for(lambda: run_finished(waiting), what="the run claimed ahead to run")
