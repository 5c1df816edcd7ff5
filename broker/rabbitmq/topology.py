"""The RabbitMQ topology the project declares (see docs/messaging.md), as plain channel calls.

The exchange ``settings.RABBITMQ_EXCHANGE`` (topic, durable); per destination a quorum
queue bound with ``<destination>.#``, with ``x-delivery-limit`` 7 and dead-lettering
through the default exchange to ``<queue>-dlq`` (another quorum queue). Listed as channel
calls so that the publisher (on a ``SelectConnection``) and the consumer (on a
``BlockingConnection``) declare the same thing.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from broker import topology


class TopologyError(Exception):
    """The broker refused a declaration (for example, a queue exists with other arguments)."""


def queue_arguments(destination: str) -> dict[str, Any]:
    return {
        "x-queue-type": "quorum",
        # The broker's own redrive. RabbitMQ counts returns, not deliveries: a limit of 6
        # returns means 7 deliveries, then the DLQ (as SQS's maxReceiveCount 7).
        "x-delivery-limit": topology.MAX_RECEIVES - 1,
        # "" is the default exchange: it routes by queue name, straight to the DLQ.
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": topology.dead_letter_queue_name(destination),
        # Quorum queues can dead-letter at least once (3.10+), which needs reject-publish.
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


DEAD_LETTER_QUEUE_ARGUMENTS = {"x-queue-type": "quorum"}


def exchange_declaration() -> tuple[str, dict[str, Any]]:
    return "exchange_declare", {
        "exchange": settings.RABBITMQ_EXCHANGE,
        "exchange_type": "topic",
        "durable": True,
    }


def declarations(destination: str) -> list[tuple[str, dict[str, Any]]]:
    """The channel calls that create a destination's queues and binding, in order."""
    queue = topology.queue_name(destination)
    return [
        (
            "queue_declare",
            {
                "queue": topology.dead_letter_queue_name(destination),
                "durable": True,
                "arguments": DEAD_LETTER_QUEUE_ARGUMENTS,
            },
        ),
        (
            "queue_declare",
            {"queue": queue, "durable": True, "arguments": queue_arguments(destination)},
        ),
        (
            "queue_bind",
            {
                "queue": queue,
                "exchange": settings.RABBITMQ_EXCHANGE,
                "routing_key": topology.binding_key(destination),
            },
        ),
    ]
