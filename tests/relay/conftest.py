"""Fixtures for the relay: per-test broker names, a consumer, rows in bulk.

Every test gets its own queue prefix (and the session its own exchange), so runs on one
machine never share a queue; the queues are deleted when the test ends.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter

import pika
import pika.exceptions
import pytest
from django.db import connection

from broker import topology
from broker.sqs.publisher import sqs_client
from broker.topology import QUEUES
from relay.management.commands.run_relay import Command
from tests.broker_queues import delete_queues

# The automations whose own queues the tests use; their queues are cleaned up too.
AUTOMATION_IDS = (5, 6, 77)
DESTINATIONS = (*QUEUES, *(f"automation-{i}" for i in AUTOMATION_IDS))


@pytest.fixture(autouse=True)
def broker_names(settings, exchange_name):
    base = settings.QUEUE_PREFIX
    settings.QUEUE_PREFIX = f"{base}{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    settings.RELAY_ENABLED = True
    # A test may point RABBITMQ_URL at a closed port; the cleanup must still reach the broker.
    url = settings.RABBITMQ_URL
    yield settings.QUEUE_PREFIX
    delete_queues(url, DESTINATIONS)


@pytest.fixture
def sqs(settings, moto_endpoint):
    settings.BROKER = "sqs"
    settings.SQS_ENDPOINT_URL = moto_endpoint
    client = sqs_client()
    yield client
    client.close()


# The broker's reply code when a consumer comes before its quorum queue's process is up.
INTERNAL_ERROR = 541


class RabbitConsumer:
    """Reads what reached a queue, the way a worker would (then acks it)."""

    def __init__(self, url: str):
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()
        # Run ids of what it took, to tell a copy sent again from a message out of place.
        self.earlier: set[str] = set()

    def reconnect(self) -> None:
        """A new connection (after the broker closed this one), remembering what it took."""
        with contextlib.suppress(pika.exceptions.AMQPError):
            self.close()
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.channel = self.connection.channel()

    def take_all(
        self, destination: str, idle: float = 0.3, timeout: float = 30.0
    ) -> list[tuple[object, dict]]:
        """Every message now in the destination's queue: (properties, envelope).

        At least as many as the queue reports holding when asked: on a loaded machine the
        first delivery may come later than ``idle``, which must not read as an empty queue.
        """
        held = self.count(destination)
        if held is None:
            return []
        received = []
        deadline = time.monotonic() + timeout
        for method, properties, body in self.channel.consume(
            topology.queue_name(destination), inactivity_timeout=idle
        ):
            if method is None:
                if len(received) >= held or time.monotonic() >= deadline:
                    break
                continue
            self.channel.basic_ack(method.delivery_tag)
            envelope = json.loads(body)
            self._remember(envelope)
            received.append((properties, envelope))
        self.channel.cancel()
        return received

    def count(self, destination: str) -> int | None:
        """How many ready messages the queue holds; None: there is no such queue."""
        try:
            declared = self.channel.queue_declare(topology.queue_name(destination), passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self.connection.channel()
            return None
        return declared.method.message_count

    def exists(self, destination: str) -> bool:
        return self.count(destination) is not None

    def take_one(self, destination: str, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            try:
                return self._take_one(destination, max(deadline - time.monotonic(), 0.01))
            except pika.exceptions.ConnectionClosedByBroker as exc:
                # A quorum queue just declared may not take consumers yet (its process is
                # still starting): the broker answers INTERNAL_ERROR and closes the
                # connection. Moments later it does.
                if exc.reply_code != INTERNAL_ERROR or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
                self.reconnect()

    def _take_one(self, destination: str, timeout: float):
        for method, properties, body in self.channel.consume(
            topology.queue_name(destination), inactivity_timeout=timeout
        ):
            if method is not None:
                self.channel.basic_ack(method.delivery_tag)
            self.channel.cancel()
            if method is None:
                return None
            envelope = json.loads(body)
            self._remember(envelope)
            return properties, envelope
        return None

    def take_run(self, destination: str, run_id: object, timeout: float):
        """The message of ``run_id`` (properties, envelope), or None after ``timeout``.

        Delivery is at least once: a relay that lost its database or broker connection
        between a confirm and its commit sends that row again. Copies of messages this
        consumer took before are passed over; any other message first is a failure.
        """
        wanted = str(run_id)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            earlier = set(self.earlier)
            received = self.take_one(destination, timeout=left)
            if received is None:
                return None
            got = received[1].get("run_id")
            if got == wanted:
                return received
            assert got in earlier, f"{got} arrived before {wanted}, and is no copy"
        return None

    def _remember(self, envelope: dict) -> None:
        self.earlier.add(envelope.get("run_id"))

    def close(self) -> None:
        # A broker that went away (or refused us) has closed it already.
        if self.connection.is_open:
            self.connection.close()


@pytest.fixture
def rabbit(settings):
    consumer = RabbitConsumer(settings.RABBITMQ_URL)
    yield consumer
    consumer.close()


def take_all_sqs(client, destination: str) -> list[dict]:
    url = client.get_queue_url(QueueName=topology.queue_name(destination))["QueueUrl"]
    envelopes = []
    while True:
        response = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=0, MessageAttributeNames=["All"]
        )
        messages = response.get("Messages", [])
        if not messages:
            return envelopes
        for message in messages:
            envelopes.append(json.loads(message["Body"]))
        client.delete_message_batch(
            QueueUrl=url,
            Entries=[
                {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(messages)
            ],
        )


def insert_pending_rows(count: int, *, queue: str = "default") -> None:
    """``count`` due platform rows in one statement (dispatch's envelope shape)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO platform_outbox_messages (run_id, queue, envelope, available_at)
            SELECT r.run_id, %(queue)s,
                   jsonb_build_object(
                       'version', 1, 'run_id', r.run_id::text, 'task', 'maintenance.purge',
                       'queue', %(queue)s, 'destination', %(queue)s, 'event', null,
                       'event_id', null, 'tenant', null, 'payload', jsonb_build_object('n', r.n),
                       'occurred_at', clock_timestamp()::text, 'correlation_id', 'bulk'),
                   clock_timestamp()
              FROM (SELECT n, gen_random_uuid() AS run_id
                      FROM generate_series(1, %(count)s) AS n) AS r
            """,
            {"queue": queue, "count": count},
        )


def run_ids(envelopes) -> Counter:
    return Counter(envelope["run_id"] for envelope in envelopes)


def drain(command: Command) -> None:
    while command.relay_one_batch():
        pass
