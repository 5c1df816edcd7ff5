"""An SQS consumer across the endpoint going away and coming back (the test's own moto
server on loopback): settling reports the outage as ``TransportUnavailable`` (the message
comes back by its visibility), and the pollers receive again once the endpoint is back,
without a restart of the consumer."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from broker import topology
from broker.base import TransportUnavailable
from broker.sqs.consumer import SQSConsumer
from broker.sqs.publisher import sqs_client


@pytest.fixture(autouse=True)
def consumer_settings(settings):
    settings.WORKER_SQS_WAIT_SECONDS = 1
    settings.WORKER_VISIBILITY_TIMEOUT = 300


def send(body: str) -> None:
    client = sqs_client()
    try:
        url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
        client.send_message(QueueUrl=url, MessageBody=body)
    finally:
        client.close()


def receive(consumer: SQSConsumer, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        deliveries = consumer.poll(0.5)
        if deliveries:
            return deliveries
    raise AssertionError("nothing arrived")


def test_an_sqs_consumer_reports_the_outage_when_settling_and_receives_again_after_it(
    private_sqs,
):
    consumer = SQSConsumer()
    consumer.start(["default"], prefetch=2)
    try:
        first = json.dumps({"run_id": str(uuid.uuid4()), "task": "test.work"})
        send(first)
        (held,) = receive(consumer)

        private_sqs.stop()
        with pytest.raises(TransportUnavailable):
            consumer.extend(held)
        assert consumer.ack_many([held]) == [held]

        private_sqs.start()
        second = json.dumps({"run_id": str(uuid.uuid4()), "task": "test.work"})
        send(second)
        received = receive(consumer)
        assert [d.body.decode() for d in received] == [second]
        consumer.ack_many(received)
    finally:
        consumer.close()
