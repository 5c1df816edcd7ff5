"""A stopped worker is over: no thread of its own left running, no message kept from others."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from broker import topology
from broker.sqs.consumer import SQSConsumer, _delivery
from broker.sqs.publisher import sqs_client
from tests.worker.conftest import dispatch_work, executions, run_finished, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

# The threads a task worker starts: its slots, the run window's claim and commit threads,
# the lease keeper, and on SQS a poller per queue.
WORKER_THREADS = ("task-", "runs-claim", "runs-done", "leases", "sqs-")


def its_threads(before: set[threading.Thread]) -> list[str]:
    return sorted(
        thread.name
        for thread in threading.enumerate()
        if thread not in before and thread.is_alive() and thread.name.startswith(WORKER_THREADS)
    )


def test_a_stopped_worker_leaves_none_of_its_threads_running(broker, relay, start_worker):
    before = set(threading.enumerate())
    worker = start_worker(concurrency=2)
    run_ids = [dispatch_work() for _ in range(3)]
    wait_for(lambda: all(run_finished(run_id) for run_id in run_ids), what="the runs")
    assert its_threads(before), "the worker's threads are found while it runs"

    worker.stop()

    # Each one ends at its next look (half a second), or when its long poll returns (SQS,
    # a second here): not 5 s after, when an idle lease keeper would end by itself, and
    # not never, as a run window's threads did.
    wait_for(lambda: not its_threads(before), timeout=3, what="the worker's threads to end")


@pytest.mark.parametrize("broker", ["sqs"], indirect=True)
def test_on_sqs_a_message_received_while_the_worker_stops_is_given_back_at_once(
    settings, broker, relay, start_worker
):
    # A poll lasts 4 s, and what it receives is hidden from everyone else for 60 s.
    settings.WORKER_SQS_WAIT_SECONDS = 4
    settings.WORKER_VISIBILITY_TIMEOUT = 60
    before = set(threading.enumerate())
    first = start_worker(concurrency=1)
    warm = dispatch_work()
    wait_for(lambda: run_finished(warm), what="the first worker to run a task")
    # Its poller began a new long poll as it took the task; the worker stops, and then a
    # message comes, which that poll receives as it arrives.
    first.stop()
    run_id = dispatch_work()
    sent_at = time.monotonic()
    wait_for(
        lambda: not [name for name in its_threads(before) if name.startswith("sqs-")],
        timeout=10,
        what="the stopped worker's poll to end",
    )

    start_worker(concurrency=1)
    # Taken by the poll that was in progress, it must not wait out its 60 s of invisibility.
    wait_for(lambda: run_finished(run_id), timeout=20, what="the other worker to run it")
    assert time.monotonic() - sent_at < 20
    assert len(executions(run_id)) == 1


@pytest.mark.parametrize("broker", ["sqs"], indirect=True)
def test_on_sqs_giving_back_says_how_many_went_back_and_how_many_did_not(broker, relay, caplog):
    consumer = SQSConsumer()
    consumer.start(["default"], prefetch=4)
    consumer.close()  # its queue known, its pollers gone: nothing received by them
    client = sqs_client()
    url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
    for number in range(3):
        client.send_message(QueueUrl=url, MessageBody=f"given back {number}")
    received = []
    while len(received) < 3:
        received += client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=3, VisibilityTimeout=60, WaitTimeSeconds=1
        ).get("Messages", [])
    # One of them is gone meanwhile: its receipt gives nothing back any more.
    client.delete_message(QueueUrl=url, ReceiptHandle=received[0]["ReceiptHandle"])
    deliveries = [_delivery("default", message) for message in received]

    with caplog.at_level(logging.INFO, logger="hubdommed.worker"):
        consumer._make_visible(client, deliveries)

    lines = [record.getMessage() for record in caplog.records]
    assert any(line.startswith("could not give back 1 message") for line in lines), lines
    assert "gave back 2 of 3 messages received while stopping" in lines, lines
    again = client.receive_message(QueueUrl=url, MaxNumberOfMessages=3, WaitTimeSeconds=1).get(
        "Messages", []
    )
    assert sorted(message["Body"] for message in again) == sorted(
        message["Body"] for message in received[1:]
    )
    client.close()
