"""One run, one worker at a time: starting a run is an atomic claim, and the holder's
lease (extended by its heartbeat) keeps every other copy of the message from running it."""

from __future__ import annotations

import threading
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
)

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
