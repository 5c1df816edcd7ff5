"""The broker: its topology, and one factory per role, each chosen by ``settings.BROKER``.

- ``get_transport``: the publisher the relay sends with;
- ``get_consumer``: what the consume loop receives and settles with;
- ``get_dead_letter_box``: an operator's view of the dead-letter queues.

Nothing here imports an app of the project: the relay, the task runtime and an
automation's worker all stand on this package.
"""

from __future__ import annotations

from django.conf import settings

from broker import topology
from broker.base import OutgoingMessage, SendResult, Transport, TransportUnavailable
from broker.consume import Consumer, DeadLetterBox

__all__ = [
    "OutgoingMessage",
    "SendResult",
    "Transport",
    "TransportUnavailable",
    "ensure_automation_queue",
    "get_consumer",
    "get_dead_letter_box",
    "get_transport",
]


def get_transport(broker: str | None = None) -> Transport:
    broker = broker or settings.BROKER
    if broker == "rabbitmq":
        from broker.rabbitmq.publisher import RabbitMQTransport

        return RabbitMQTransport()
    if broker == "sqs":
        from broker.sqs.publisher import SQSTransport

        return SQSTransport()
    raise ValueError(f"unknown broker {broker!r} (known: rabbitmq, sqs)")


def get_consumer(broker: str | None = None) -> Consumer:
    broker = broker or settings.BROKER
    if broker == "rabbitmq":
        from broker.rabbitmq.consumer import RabbitMQConsumer

        return RabbitMQConsumer()
    if broker == "sqs":
        from broker.sqs.consumer import SQSConsumer

        return SQSConsumer()
    raise ValueError(f"unknown broker {broker!r} (known: rabbitmq, sqs)")


def get_dead_letter_box(broker: str | None = None) -> DeadLetterBox:
    broker = broker or settings.BROKER
    if broker == "rabbitmq":
        from broker.rabbitmq.dead_letters import RabbitMQDeadLetterBox

        return RabbitMQDeadLetterBox()
    if broker == "sqs":
        from broker.sqs.dead_letters import SQSDeadLetterBox

        return SQSDeadLetterBox()
    raise ValueError(f"unknown broker {broker!r} (known: rabbitmq, sqs)")


def ensure_automation_queue(automation_id: int) -> str:
    """Create an automation's own queue (and its dead-letter queue) on the configured broker.

    Idempotent. Called by the task subscribed to ``AutomationCreated``; the relay also
    makes sure of it before it publishes the first message addressed there.
    Returns the queue's name.
    """
    destination = topology.automation_queue_name(automation_id)
    transport = get_transport()
    try:
        transport.ensure_destination(destination)
    finally:
        transport.close()
    return topology.queue_name(destination)
