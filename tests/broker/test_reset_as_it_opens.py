"""A connection that the broker's node resets as it opens (the node killed between the
TCP handshake and pika's first look at the socket) is the broker unreachable, for every
connection of the project: the worker's consumer and the relay's publisher try again, the
dead-letter pages answer with pika's own family. Before, pika's ValueError ("Expected
connected socket, but getpeername() failed") escaped them, and a worker that met it during
a cluster node's kill never consumed again.

The reset is made where pika meets it, once: its stream connector refuses the socket as
it does when getpeername() fails. The next connection is the shared broker's, as usual.
"""

from __future__ import annotations

import json
import uuid

import pika
import pytest
from pika.adapters.utils import io_services_utils

from broker import OutgoingMessage
from broker.base import TransportUnavailable
from broker.rabbitmq.consumer import RabbitMQConsumer
from broker.rabbitmq.dead_letters import RabbitMQDeadLetterBox
from broker.rabbitmq.publisher import RabbitMQTransport


@pytest.fixture
def reset_once(monkeypatch):
    """The next connection pika opens is reset as it opens; the ones after are not."""
    connector = io_services_utils._AsyncStreamConnector
    opening = connector.__init__
    resets: list[int] = []

    def reset(self, nbio, protocol_factory, sock, *args, **kwargs):
        if not resets:
            resets.append(sock.fileno())
            raise ValueError(
                "Expected connected socket, but getpeername() failed: "
                f"error=OSError(107, 'Transport endpoint is not connected'); {sock}; "
            )
        return opening(self, nbio, protocol_factory, sock, *args, **kwargs)

    monkeypatch.setattr(connector, "__init__", reset)
    return resets


def test_the_consumer_takes_it_for_the_broker_unreachable(reset_once, settings):
    consumer = RabbitMQConsumer(settings.RABBITMQ_URL)
    try:
        with pytest.raises(TransportUnavailable):
            consumer.start(["default"], 4)
        assert reset_once
        consumer.start(["default"], 4)  # what the worker's loop does next
    finally:
        consumer.close()


def test_the_dead_letter_box_raises_pikas_own_family(reset_once, settings):
    with pytest.raises(pika.exceptions.AMQPError):
        RabbitMQDeadLetterBox(settings.RABBITMQ_URL)
    assert reset_once


def test_the_relays_publisher_reports_the_broker_unreachable_then_sends(reset_once):
    transport = RabbitMQTransport()
    message = OutgoingMessage(
        key=1,
        run_id=str(uuid.uuid4()),
        destination="default",
        task="maintenance.purge",
        body=json.dumps({"payload": {}}).encode(),
        correlation_id="",
    )
    try:
        first = transport.send([message])
        assert reset_once
        assert first.error and first.unconfirmed == [1] and not first.sent, first
        # The relay backs off and tries again with a new connection.
        assert transport.send([message]).sent == [1]
    finally:
        transport.close()
