"""Fixtures for the relay: per-test broker names, a consumer, rows in bulk.

Every test gets its own queue prefix (and the session its own exchange), so runs on one
machine never share a queue; the queues are deleted when the test ends.
"""

from __future__ import annotations

import json
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


class RabbitConsumer:
    """Reads what reached a queue, the way a worker would (then acks it)."""

    def __init__(self, url: str):
        self.url = url
        self.connection = pika.BlockingConnection(pika.URLParameters(url))
        self.channel = self.connection.channel()

    def reconnect(self) -> None:
        self.close()
        self.connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self.channel = self.connection.channel()

    def take_all(self, destination: str, idle: float = 0.3) -> list[tuple[object, dict]]:
        """Every message now in the destination's queue: (properties, envelope)."""
        if not self.exists(destination):
            return []
        received = []
        for method, properties, body in self.channel.consume(
            topology.queue_name(destination), inactivity_timeout=idle
        ):
            if method is None:
                break
            self.channel.basic_ack(method.delivery_tag)
            received.append((properties, json.loads(body)))
        self.channel.cancel()
        return received

    def exists(self, destination: str) -> bool:
        try:
            self.channel.queue_declare(topology.queue_name(destination), passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            self.channel = self.connection.channel()
            return False
        return True

    def take_one(self, destination: str, timeout: float):
        for method, properties, body in self.channel.consume(
            topology.queue_name(destination), inactivity_timeout=timeout
        ):
            if method is not None:
                self.channel.basic_ack(method.delivery_tag)
            self.channel.cancel()
            return None if method is None else (properties, json.loads(body))
        return None

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
