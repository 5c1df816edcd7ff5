"""A message returned to its queue again and again never strands its run.

Every return counts towards the queue's delivery limit, whatever caused it: a worker
that gave its window back at shutdown, one that crashed with it, a lost connection. The
broker dead-letters a message returned once more on its last delivery, without a word to
anyone: had a worker claimed its run, the run would be left ``running`` with no message
left to move it. So a message near its last delivery is not held: it is replaced by a
fresh copy, through its outbox row, and acked. And a run whose workers died on it again
and again is not run for ever: past three times the receives it may have, it is failed.
"""

from __future__ import annotations

import subprocess

import pika
import pytest
from django.conf import settings

from broker import topology
from broker.sqs.publisher import sqs_client
from outbox.models import PlatformOutboxMessage, TaskRun
from tests.worker.conftest import (
    dead_letters,
    dispatch_work,
    executions,
    go_ahead,
    run_finished,
    run_of,
    wait_for,
    worker_command,
    worker_environment,
)
from worker.processor import RECEIVED_TOO_OFTEN_FACTOR, RENEW_FROM_DELIVERY

pytestmark = pytest.mark.django_db(transaction=True)


def _sent(run_id: str) -> bool:
    return PlatformOutboxMessage.objects.get(run_id=run_id).sent_at is not None


def _returned(channel, body_run_id: str) -> None:
    """Take the message of this run from the queue and give it back (one return)."""
    method, _properties, body = channel.basic_get(topology.queue_name("default"))
    assert method is not None and body_run_id.encode() in body, body
    channel.basic_nack(method.delivery_tag, requeue=True)


@pytest.mark.parametrize("broker", ["rabbitmq"], indirect=True)
@pytest.mark.timeout(120)
def test_a_message_on_its_last_delivery_held_by_a_worker_that_dies_still_has_its_run_done(
    broker, relay, start_worker
):
    first = dispatch_work(wait_for_go_ahead=True)
    wait_for(lambda: _sent(first), what="the first message to be sent")
    bounced = dispatch_work()
    wait_for(lambda: _sent(bounced), what="the second message to be sent")

    # The second message returned six times (as six workers' windows given back would):
    # its next delivery is its last before the broker's redrive. The first one is
    # returned meanwhile, so that it is delivered first, and blocks the only slot.
    connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = connection.channel()
        held, _, body = channel.basic_get(topology.queue_name("default"))
        assert first.encode() in body
        for _ in range(topology.MAX_RECEIVES - 2):
            _returned(channel, bounced)
        channel.basic_nack(held.delivery_tag, requeue=True)
        _returned(channel, bounced)
    finally:
        connection.close()

    process = subprocess.Popen(
        worker_command("--queues", "default", "--concurrency", "1"),
        env=worker_environment(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_for(lambda: executions(first), what="the first task to start in the subprocess")
        # The second message is in the worker's window behind it, its run claimed ahead
        # (the bounced message itself, or a fresh copy of it).
        wait_for(
            lambda: run_of(bounced).status == TaskRun.Status.RUNNING,
            what="the worker to claim the second run",
        )
        process.kill()
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
        process.stderr.close()

    go_ahead(first)
    start_worker(concurrency=2)
    wait_for(lambda: run_finished(bounced), what="the bounced run to be done elsewhere")
    wait_for(lambda: run_finished(first), what="the first run to be done after the kill")

    assert run_of(bounced).status == TaskRun.Status.SUCCEEDED
    assert len(executions(bounced)) == 1
    assert dead_letters() == []


def _return(run_id: str, times: int) -> None:
    """Receive the run's message and give it back, ``times`` times (as windows given back,
    or workers that died, would)."""
    if settings.BROKER == "rabbitmq":
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            channel = connection.channel()
            for _ in range(times):
                _returned(channel, run_id)
        finally:
            connection.close()
        return
    client = sqs_client()
    try:
        url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
        for _ in range(times):
            (message,) = wait_for(
                lambda: client.receive_message(QueueUrl=url, WaitTimeSeconds=1).get("Messages"),
                what="the message",
            )
            assert run_id in message["Body"]
            client.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )
    finally:
        client.close()


@pytest.mark.parametrize(
    "returns",
    [RENEW_FROM_DELIVERY - 1, topology.MAX_RECEIVES - 1],
    ids=["the-first-replaced", "the-last"],
)
def test_a_message_near_its_last_delivery_is_replaced_by_a_fresh_copy_and_runs_once(
    broker, relay, start_worker, returns
):
    run_id = dispatch_work()
    wait_for(lambda: _sent(run_id), what="the message to be sent")
    _return(run_id, returns)

    worker = start_worker(concurrency=1)
    wait_for(lambda: run_finished(run_id), what="the run to be done")
    wait_for(lambda: worker.processor.outcomes["succeeded"], what="its message acked")

    # Not run from the message near its last delivery: from the copy that replaced it.
    assert worker.processor.outcomes == {"renewed": 1, "succeeded": 1}
    run = run_of(run_id)
    assert run.status == TaskRun.Status.SUCCEEDED
    assert run.receive_count == 1
    assert len(executions(run_id)) == 1
    assert dead_letters() == []


def test_a_message_returned_fewer_times_is_run_as_it_is(broker, relay, start_worker):
    run_id = dispatch_work()
    wait_for(lambda: _sent(run_id), what="the message to be sent")
    _return(run_id, RENEW_FROM_DELIVERY - 2)

    worker = start_worker(concurrency=1)
    wait_for(lambda: run_finished(run_id), what="the run to be done")
    wait_for(lambda: worker.processor.outcomes["succeeded"], what="its message acked")

    assert worker.processor.outcomes == {"succeeded": 1}


def test_a_run_received_far_more_often_than_its_task_allows_is_dead_lettered_not_run(
    broker, relay, start_worker
):
    run_id = dispatch_work()
    # Claimed again and again by workers that died on it (three times the broker's limit).
    TaskRun.objects.filter(run_id=run_id).update(
        receive_count=RECEIVED_TOO_OFTEN_FACTOR * topology.MAX_RECEIVES
    )

    worker = start_worker(concurrency=1)
    wait_for(lambda: run_finished(run_id), what="the run to be ended")
    wait_for(lambda: worker.processor.outcomes["failed"], what="its message dead-lettered")

    assert worker.processor.outcomes == {"failed": 1}
    run = run_of(run_id)
    assert run.status == TaskRun.Status.FAILED
    assert "ReceivedTooOften" in run.last_error
    assert executions(run_id) == []
    (parked,) = dead_letters()
    assert parked.run_id == run_id
    assert parked.error["x-error-type"] == "worker.processor.ReceivedTooOften"
