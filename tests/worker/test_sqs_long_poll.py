"""A long poll as long as SQS allows (``WORKER_SQS_WAIT_SECONDS`` up to 20) outlasts the
client's usual read timeout (10 s): the receiving client waits for the whole poll and a
margin, so a poll with nothing to receive is not a failure, and a message the poll took
is not hidden by an abandoned request for its whole visibility."""

from __future__ import annotations

import logging
import time

import pytest

from broker import topology
from broker.sqs.consumer import SQSConsumer
from broker.sqs.publisher import TIMEOUT, sqs_client

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(120)]


@pytest.fixture
def receive_requests(monkeypatch) -> list[float]:
    """When each ReceiveMessage request of the consumer's pollers went out (botocore's own
    retries of a request that timed out included)."""
    from broker.sqs import consumer as module

    sent: list[float] = []

    def counted(**kwargs):
        client = sqs_client(**kwargs)
        client.meta.events.register(
            "before-send.sqs.ReceiveMessage", lambda **_: sent.append(time.monotonic())
        )
        return client

    monkeypatch.setattr(module, "sqs_client", counted)
    return sent


@pytest.mark.parametrize("broker", ["sqs"], indirect=True)
def test_a_long_poll_past_the_clients_timeout_receives_without_failing(
    broker, relay, settings, caplog, receive_requests
):
    settings.WORKER_SQS_WAIT_SECONDS = 20  # the most SQS allows, past TIMEOUT
    consumer = SQSConsumer()
    client = sqs_client()
    with caplog.at_level(logging.WARNING, logger="hubdommed.worker"):
        consumer.start(["default"], prefetch=1)
        try:
            url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
            # Sent after the client's usual timeout, while the first poll still waits.
            began = time.monotonic()
            time.sleep(TIMEOUT + 1)
            sent_at = time.monotonic()
            client.send_message(QueueUrl=url, MessageBody="late")
            received = []
            while not received and time.monotonic() - began < 60:
                received = consumer.poll(timeout=1.0)
        finally:
            consumer.close()
            client.close()

    assert [delivery.body for delivery in received] == [b"late"]
    # One request waited the whole time: none was given up on (and sent again) before the
    # message came, which the abandoned request's poll could have taken and hidden.
    assert len([at for at in receive_requests if at < sent_at]) == 1, receive_requests
    failures = [r.getMessage() for r in caplog.records if "receive" in r.getMessage()]
    assert failures == []
