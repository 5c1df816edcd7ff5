"""What a test declared on the shared RabbitMQ, removed at its end."""

from __future__ import annotations

from collections.abc import Iterable

import pika

from broker import topology
from broker.topology import QUEUES


def delete_queues(url: str, destinations: Iterable[str] = QUEUES) -> None:
    """Delete each destination's queue and its dead-letter queue, named under the queue
    prefix the settings hold now (the test's own). ``url``: the broker's, taken before the
    test ran, as a test may point RABBITMQ_URL at a closed port."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for destination in destinations:
            channel.queue_delete(topology.queue_name(destination))
            channel.queue_delete(topology.dead_letter_queue_name(destination))
    finally:
        connection.close()
