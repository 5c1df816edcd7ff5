"""A dead letter SQS takes whatever the error says: its attributes hold only characters
SQS accepts, and they leave room for the body under 256 KiB.

A dead letter SQS refuses is never parked: the message comes back, fails the same way,
and its run is never settled (after the broker's redrive, a fresh copy from the outbox
starts it all again). moto's server checks neither the characters of an attribute nor
the size of body and attributes together, so SQS's checks are emulated at the client
boundary.
"""

from __future__ import annotations

import json
import re
import time
import uuid

import pytest
from botocore.exceptions import ClientError

from broker import topology
from broker.consume import FailureContext
from broker.sqs.consumer import SQSConsumer
from broker.sqs.publisher import sqs_client

SQS_LIMIT = 256 * 1024
REFUSED_BY_SQS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


@pytest.fixture
def sqs_default(settings, moto_endpoint):
    """The ``default`` queue on moto's server, under this test's own prefix; a consumer
    of it (started), and a client."""
    settings.BROKER = "sqs"
    settings.SQS_ENDPOINT_URL = moto_endpoint
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{uuid.uuid4().hex[:6]}-"
    settings.WORKER_SQS_WAIT_SECONDS = 1
    consumer = SQSConsumer()
    consumer.start(["default"], prefetch=1)
    client = sqs_client()
    yield consumer, client
    consumer.close()
    for name in (topology.queue_name("default"), topology.dead_letter_queue_name("default")):
        client.delete_queue(QueueUrl=client.get_queue_url(QueueName=name)["QueueUrl"])
    client.close()


def emulate_sqs_checks(consumer: SQSConsumer) -> None:
    """SQS's answers to a SendMessage over 256 KiB (body and attributes: names, types,
    values) or with a character it refuses."""

    def check(params, **_):
        attributes = params.get("MessageAttributes", {})
        size = len(params["MessageBody"].encode()) + sum(
            len(name.encode()) + len(value["DataType"]) + len(value["StringValue"].encode())
            for name, value in attributes.items()
        )
        texts = [params["MessageBody"], *(v["StringValue"] for v in attributes.values())]
        if size > SQS_LIMIT:
            code = "InvalidParameterValue"
        elif any(REFUSED_BY_SQS.search(text) for text in texts):
            code = "InvalidMessageContents"
        else:
            return
        raise ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": 400}}, "SendMessage"
        )

    consumer._client.meta.events.register("provide-client-params.sqs.SendMessage", check)


def receive_one(consumer: SQSConsumer, client, body: str):
    url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
    client.send_message(
        QueueUrl=url,
        MessageBody=body,
        MessageAttributes={"type": {"DataType": "String", "StringValue": "test.work"}},
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        deliveries = consumer.poll(0.5)
        if deliveries:
            return deliveries[0]
    raise AssertionError("the message never arrived")


def dead_letters(client) -> list[dict]:
    url = client.get_queue_url(QueueName=topology.dead_letter_queue_name("default"))["QueueUrl"]
    return client.receive_message(
        QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
    ).get("Messages", [])


def failure(message: str, traceback: str) -> FailureContext:
    return FailureContext(
        error_type="tests.Oops",
        message=message,
        traceback=traceback,
        receive_count=5,
        failed_at="2026-01-01T00:00:00Z",
    )


def test_an_error_with_characters_sqs_refuses_is_dead_lettered_with_them_replaced(sqs_default):
    consumer, client = sqs_default
    emulate_sqs_checks(consumer)
    body = json.dumps({"run_id": str(uuid.uuid4()), "task": "test.work", "payload": {}})
    delivery = receive_one(consumer, client, body)

    consumer.dead_letter(delivery, failure("bell \x07 and \ufffe here", "tb \x1b[0m\nline\t2"))
    consumer.ack(delivery)

    (letter,) = dead_letters(client)
    assert letter["Body"] == body
    attributes = letter["MessageAttributes"]
    assert attributes["x-error-message"]["StringValue"] == "bell \ufffd and \ufffd here"
    assert attributes["x-error-traceback"]["StringValue"] == "tb \ufffd[0m\nline\t2"
    assert attributes["type"]["StringValue"] == "test.work"


def test_a_body_near_256_kib_is_dead_lettered_with_its_error_cut_to_fit(sqs_default):
    consumer, client = sqs_default
    emulate_sqs_checks(consumer)
    envelope = {"run_id": str(uuid.uuid4()), "task": "test.work", "payload": {"blob": ""}}
    envelope["payload"]["blob"] = "x" * (SQS_LIMIT - 600 - len(json.dumps(envelope)))
    body = json.dumps(envelope)
    delivery = receive_one(consumer, client, body)

    consumer.dead_letter(delivery, failure("é" * 1000, "Traceback\n" * 200))
    consumer.ack(delivery)

    (letter,) = dead_letters(client)
    assert letter["Body"] == body
    attributes = letter["MessageAttributes"]
    assert attributes["x-error-type"]["StringValue"] == "tests.Oops"
    assert attributes["x-error-traceback"]["StringValue"] == "-"
    message = attributes["x-error-message"]["StringValue"]
    assert message and set(message) == {"é"}
