"""The broker: its topology, and one factory per role, each chosen by ``settings.BROKER``.

- ``get_transport``: the publisher the relay sends with;
- ``get_consumer``: what the consume loop receives and settles with;
- ``get_dead_letter_box``: an operator's view of the dead-letter queues.

Nothing here imports an app of the project: the relay, the task runtime and an
automation's worker all stand on this package.
"""

from __future__ import annotations

from django.conf import settings
from django.utils.module_loading import import_string

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


# Each role's class on each broker, imported only when asked for: a hub on one broker
# never loads the other's client library.
_IMPLEMENTATIONS = {
    "rabbitmq": {
        "transport": "broker.rabbitmq.publisher.RabbitMQTransport",
        "consumer": "broker.rabbitmq.consumer.RabbitMQConsumer",
        "dead_letter_box": "broker.rabbitmq.dead_letters.RabbitMQDeadLetterBox",
    },
    "sqs": {
        "transport": "broker.sqs.publisher.SQSTransport",
        "consumer": "broker.sqs.consumer.SQSConsumer",
        "dead_letter_box": "broker.sqs.dead_letters.SQSDeadLetterBox",
    },
}


def _implementation(role: str, broker: str | None):
    broker = broker or settings.BROKER
    if broker not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown broker {broker!r} (known: rabbitmq, sqs)")
    return import_string(_IMPLEMENTATIONS[broker][role])()


def get_transport(broker: str | None = None) -> Transport:
    return _implementation("transport", broker)


def get_consumer(broker: str | None = None) -> Consumer:
    return _implementation("consumer", broker)


def get_dead_letter_box(broker: str | None = None) -> DeadLetterBox:
    return _implementation("dead_letter_box", broker)


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
