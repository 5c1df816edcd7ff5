"""The bookkeeping of a window of deliveries: the runs of the messages received together are
claimed in one statement, the successes of many slots committed in one statement before
one ack. Same guarantees as one message at a time: tested where the windows open new gaps
(a crash between a group commit and its acks; a window holding a run another worker holds;
two workers claiming overlapping windows at once)."""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from datetime import timedelta

import pika
import pytest
from django.conf import settings as django_settings
from django.db import connection, transaction
from django.utils import timezone

from broker.sqs.publisher import SQSTransport, sqs_client
from broker.topology import queue_name
from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.runs import Begin, Lease, RunLedger
from outbox.services import dispatch
from tests.worker.conftest import (
    claim,
    dispatch_work,
    executions,
    go_ahead,
    run_finished,
    run_of,
    wait_for,
    worker_environment,
)
from worker.builders import window_for

pytestmark = pytest.mark.django_db(transaction=True)

# The real ``run_worker``, in its own process, dying (without any cleanup, as a killed
# process does) at the moment it would send the acks of its first group commit.
CRASH_BEFORE_ACKS = """
import os, sys
import django
django.setup()
from broker.rabbitmq.consumer import RabbitMQConsumer
from broker.sqs.consumer import SQSConsumer

def crash(self, deliveries, *, wait=True):
    os._exit(17)

RabbitMQConsumer.ack_many = SQSConsumer.ack_many = crash
from django.core.management import call_command
call_command("run_worker", "--queues", "default", "--concurrency", "2")
"""


def _all_sent(run_ids: list[str]) -> bool:
    return PlatformOutboxMessage.objects.filter(
        run_id__in=run_ids, sent_at__isnull=False
    ).count() == len(run_ids)


def envelope(run_id: str) -> dict:
    return {"run_id": run_id, "task": "test.work", "queue": "default"}


def test_a_crash_between_a_group_commit_and_its_acks_delivers_duplicates_that_are_only_acked(
    broker, relay, start_worker
):
    run_ids = [dispatch_work() for _ in range(6)]
    wait_for(lambda: _all_sent(run_ids), what="the messages to be sent")

    process = subprocess.run(
        [sys.executable, "-c", CRASH_BEFORE_ACKS],
        env=worker_environment(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert process.returncode == 17, process.stderr[-2000:]
    # The group commit happened: those runs are recorded succeeded, their messages unacked.
    committed = set(
        TaskRun.objects.filter(run_id__in=run_ids, status=TaskRun.Status.SUCCEEDED).values_list(
            "run_id", flat=True
        )
    )
    assert committed
    committed = {str(run_id) for run_id in committed}

    worker = start_worker(concurrency=2)
    wait_for(lambda: all(run_finished(run_id) for run_id in run_ids), what="every run to finish")
    wait_for(
        lambda: worker.processor.outcomes["duplicate"] >= len(committed),
        what="the redelivered copies of the committed runs to be skipped",
    )
    for run_id in committed:
        run = run_of(run_id)
        # Recognised as a duplicate: not claimed, not run again.
        assert run.status == TaskRun.Status.SUCCEEDED
        assert run.receive_count == 1
        assert len(executions(run_id)) == 1
    assert all(run_of(run_id).status == TaskRun.Status.SUCCEEDED for run_id in run_ids)


def test_a_window_with_a_run_held_by_another_worker_runs_the_others_only(
    broker, relay, start_worker
):
    with transaction.atomic():
        run_ids = [str(dispatch("test.work", {"n": number})) for number in range(5)]
        held = run_ids[2]
        # Another worker claimed it (under a live lease) before this one sees its message.
        TaskRun.objects.filter(run_id=held).update(
            status=TaskRun.Status.RUNNING,
            lease_holder="elsewhere:1:abc",
            lease_expires_at=timezone.now() + timedelta(seconds=60),
            receive_count=1,
        )
    wait_for(lambda: _all_sent(run_ids), what="the messages to be sent")

    worker = start_worker(concurrency=2)
    others = [run_id for run_id in run_ids if run_id != held]
    wait_for(lambda: all(run_finished(run_id) for run_id in others), what="the others to finish")
    wait_for(lambda: worker.processor.outcomes["busy"] == 1, what="the held one to be turned away")

    assert all(len(executions(run_id)) == 1 for run_id in others)
    assert executions(held) == []
    run = run_of(held)
    assert (run.status, run.lease_holder, run.receive_count) == (
        TaskRun.Status.RUNNING,
        "elsewhere:1:abc",
        1,
    )


def test_one_claim_statement_sorts_a_window_into_run_busy_and_duplicate():
    ledger = RunLedger()
    run_ids = [str(uuid.uuid4()) for _ in range(4)]
    held, done = run_ids[1], run_ids[3]
    claim(ledger, envelope(held), holder="other", lease=60)
    claim(ledger, envelope(done), holder="earlier", lease=60)
    ledger.succeeded_many([Lease(done, "earlier", 60, 20)])

    window = [(envelope(run_id), f"h{n}", 60.0) for n, run_id in enumerate(run_ids)]
    started = ledger.begin_many(window)

    assert {holder: result.decision for holder, result in started.items()} == {
        "h0": Begin.RUN,
        "h1": Begin.BUSY,
        "h2": Begin.RUN,
        "h3": Begin.SKIP,
    }
    assert 0 < started["h1"].lease_remaining <= 60
    assert run_of(held).lease_holder == "other"
    assert [run_of(run_ids[n]).lease_holder for n in (0, 2)] == ["h0", "h2"]
    # Two copies of one run in one window: the first claims it, the second is turned away.
    twice = str(uuid.uuid4())
    started = ledger.begin_many([(envelope(twice), holder, 60.0) for holder in ("first", "second")])
    assert (started["first"].decision, started["second"].decision) == (Begin.RUN, Begin.BUSY)


def test_a_success_is_recorded_only_by_the_holder_still_holding_the_run():
    ledger = RunLedger()
    mine, taken_over = str(uuid.uuid4()), str(uuid.uuid4())
    claim(ledger, envelope(mine), holder="me", lease=60)
    claim(ledger, envelope(taken_over), holder="me", lease=60)
    TaskRun.objects.filter(run_id=taken_over).update(lease_holder="successor")

    marked = ledger.succeeded_many([Lease(mine, "me", 60, 20), Lease(taken_over, "me", 60, 20)])

    assert marked == {mine}
    assert run_of(mine).status == TaskRun.Status.SUCCEEDED
    assert (run_of(taken_over).status, run_of(taken_over).lease_holder) == (
        TaskRun.Status.RUNNING,
        "successor",
    )


@pytest.mark.parametrize("recorded", [True, False], ids=["queued-runs", "runs-not-recorded-yet"])
def test_two_workers_claiming_overlapping_windows_at_once_claim_each_run_once(recorded):
    """Windows sharing runs, in opposite orders, from two connections released together,
    many times: each run goes to exactly one of them, and no claim fails (a deadlock would
    abort one of the statements). The runs are queued ones (the claim's own statement
    locks them), or not recorded yet (the first to find one missing records it)."""
    rounds, size = 30, 20
    windows = [[str(uuid.uuid4()) for _ in range(size)] for _ in range(rounds)]
    if recorded:
        TaskRun.objects.bulk_create(
            TaskRun(run_id=run_id, task="test.work", queue="default")
            for window in windows
            for run_id in window
        )
        # Among a history of finished runs, as in production: the runs are found by key.
        TaskRun.objects.bulk_create(
            TaskRun(
                run_id=uuid.uuid4(),
                task="test.work",
                queue="default",
                status=TaskRun.Status.SUCCEEDED,
            )
            for _ in range(5_000)
        )
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE task_runs")
    barrier = threading.Barrier(2)
    won: list[set[str]] = [set(), set()]
    errors: list[BaseException] = []

    def claim(side: int) -> None:
        ledger = RunLedger()
        try:
            connection.ensure_connection()
            for window in windows:
                order = window if side == 0 else list(reversed(window))
                barrier.wait(timeout=30)
                started = ledger.begin_many(
                    [(envelope(run_id), f"w{side}:{run_id}", 60.0) for run_id in order]
                )
                won[side].update(
                    run_id for run_id in order if started[f"w{side}:{run_id}"].decision is Begin.RUN
                )
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()
        finally:
            connection.close()

    threads = [threading.Thread(target=claim, args=(side,)) for side in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    every = {run_id for window in windows for run_id in window}
    assert won[0] | won[1] == every
    assert not won[0] & won[1]
    for run in TaskRun.objects.filter(run_id__in=every):
        side = 0 if str(run.run_id) in won[0] else 1
        assert (run.receive_count, run.lease_holder) == (1, f"w{side}:{run.run_id}")


def test_a_handler_past_its_time_limit_is_abandoned_its_slot_replaced_its_late_result_ignored(
    broker, relay, start_worker
):
    # One slot: the retry can only run if the stuck handler's slot was given to a new thread.
    worker = start_worker(concurrency=1)
    with transaction.atomic():
        run_id = str(dispatch("test.limited", {"first_sleep": 4}))

    wait_for(lambda: len(executions(run_id)) == 2, what="the retry to start in a new slot")
    (first, started_at), (second, retried_at) = executions(run_id)
    assert (first, second) == (1, 2)
    # Retried while the first handler still slept: after its 1 s limit plus the backoff.
    assert retried_at - started_at < 4
    # The retry was refused for good: the run failed, its message dead-lettered.
    wait_for(lambda: run_finished(run_id), what="the retry to settle the run")
    assert run_of(run_id).status == TaskRun.Status.FAILED

    # The abandoned handler then returns as if it had succeeded: ignored.
    wait_for(
        lambda: timezone.now().timestamp() > started_at + 4.5,
        what="the abandoned handler to return",
    )
    wait_for(lambda: worker.worker.in_flight == 0, what="the worker to settle everything")
    run = run_of(run_id)
    assert (run.status, run.receive_count) == (TaskRun.Status.FAILED, 2)
    assert "refused on a later receive" in run.last_error
    assert worker.processor.outcomes["succeeded"] == 0
    assert worker.processor.outcomes["failed"] == 1
    assert worker.processor.outcomes["retrying"] == 1


def test_a_window_claimed_again_by_the_same_holders_is_theirs_without_a_second_receive():
    """A claim whose answer a dropped connection lost is tried again with the same holders:
    the runs it took are found held by them, not turned away as held by someone else."""
    ledger = RunLedger()
    run_ids = [str(uuid.uuid4()) for _ in range(3)]
    window = [(envelope(run_id), f"holder-{run_id}", 60.0) for run_id in run_ids]
    ledger.begin_many(window)

    again = ledger.begin_many(window)

    assert [again[f"holder-{run_id}"].decision for run_id in run_ids] == [Begin.RUN] * 3
    assert [run_of(run_id).receive_count for run_id in run_ids] == [1, 1, 1]


def _ready_messages(destinations) -> int:
    """The broker's own count of the messages its queues still hold for anyone (ready:
    neither delivered nor in flight)."""
    if django_settings.BROKER == "sqs":
        client = sqs_client()
        transport = SQSTransport()
        try:
            return sum(
                int(
                    client.get_queue_attributes(
                        QueueUrl=transport.queue_url(destination),
                        AttributeNames=["ApproximateNumberOfMessages"],
                    )["Attributes"]["ApproximateNumberOfMessages"]
                )
                for destination in destinations
            )
        finally:
            transport.close()
    rabbit = pika.BlockingConnection(pika.URLParameters(django_settings.RABBITMQ_URL))
    try:
        channel = rabbit.channel()
        return sum(
            channel.queue_declare(queue_name(destination), passive=True).method.message_count
            for destination in destinations
        )
    finally:
        rabbit.close()


QUEUE_CLASSES = ("critical", "default", "bulk", "maintenance")


def test_a_worker_consuming_four_full_queues_holds_one_window_not_one_per_queue(
    broker, relay, start_worker
):
    per_queue = window_for(1) + 8  # each queue alone could fill the window
    run_ids: list[str] = []
    with transaction.atomic():
        for queue in QUEUE_CLASSES:
            name = "test.work" if queue == "default" else f"test.work.{queue}"
            run_ids += [str(dispatch(name, {"wait_for_go_ahead": True})) for _ in range(per_queue)]
    wait_for(lambda: _all_sent(run_ids), what="the messages to be sent")

    worker = start_worker(concurrency=1, queues=QUEUE_CLASSES)
    window = window_for(1)  # one slot
    try:
        held = _held_once_settled(worker, run_ids, QUEUE_CLASSES, window)
        assert held <= window, f"{held} runs held by a worker whose window is {window}"
    finally:
        for run_id in run_ids:
            go_ahead(run_id)


def _held_once_settled(worker, run_ids: list[str], queues, window: int) -> int:
    """The runs of ``run_ids`` the worker holds claimed, once its window filled and nothing
    is on its way any more: what left the queues is what the worker received, and every
    message it received is claimed."""

    def claimed() -> int:
        return TaskRun.objects.filter(run_id__in=run_ids, status=TaskRun.Status.RUNNING).count()

    wait_for(lambda: claimed() >= window, what="the worker's window to fill")
    wait_for(
        lambda: len(run_ids) - _ready_messages(queues) == worker.worker.stats.received == claimed(),
        what="the broker's count and the worker's claims to agree",
    )
    return claimed()


def test_the_window_per_slot_is_the_operators_to_set(broker, relay, start_worker, settings):
    settings.WORKER_PREFETCH_PER_SLOT = 5
    window = 2 * 5  # two slots
    run_ids = [dispatch_work(wait_for_go_ahead=True) for _ in range(window + 6)]
    wait_for(lambda: _all_sent(run_ids), what="the messages to be sent")

    worker = start_worker(concurrency=2)
    try:
        held = _held_once_settled(worker, run_ids, ("default",), window)
        assert held == window, f"{held} runs held by a worker whose window is {window}"
    finally:
        for run_id in run_ids:
            go_ahead(run_id)
