from __future__ import annotations

import uuid

import pika
import pytest

from broker import topology


@pytest.fixture
def default_queue(settings, exchange_name):
    """The ``default`` queue class under this test's own exchange and queue prefix: its
    name. The queue and its dead-letter queue are deleted at the end, on the broker the
    test started with (a test may point ``RABBITMQ_URL`` elsewhere meanwhile)."""
    settings.RABBITMQ_EXCHANGE = exchange_name
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{uuid.uuid4().hex[:6]}-"
    names = (topology.queue_name("default"), topology.dead_letter_queue_name("default"))
    broker = pika.URLParameters(settings.RABBITMQ_URL)
    yield names[0]
    conn = pika.BlockingConnection(broker)
    try:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)
    finally:
        conn.close()


def publish_confirmed(url: str, queue: str, bodies: list[bytes]) -> None:
    """Publish ``bodies`` to ``queue`` through the default exchange and return once the
    broker confirmed each: a test that then waits for them knows they are in the queue
    (unconfirmed, a busy broker may still be taking them, or have refused them unseen)."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.confirm_delivery()
        for body in bodies:
            channel.basic_publish("", queue, body, mandatory=True)
    finally:
        connection.close()
