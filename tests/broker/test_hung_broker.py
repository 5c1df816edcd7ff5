"""A RabbitMQ node that accepts the connection and never answers (a hung node, a proxy
in front of a dead one): every blocking connection of the project gives up within its
bound with the transport's own error, which the worker's loop, the dead-letter pages and
the probe answer, never with pika's handshake timeout escaping them."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from broker.base import TransportUnavailable
from broker.rabbitmq.connection import CONNECT_TIMEOUT
from broker.rabbitmq.consumer import RabbitMQConsumer
from broker.rabbitmq.dead_letters import RabbitMQDeadLetterBox


@pytest.fixture
def silent_node() -> Iterator[str]:
    """An amqp:// URL whose node accepts TCP connections and never says a word."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"amqp://guest:guest@127.0.0.1:{listener.getsockname()[1]}/%2F"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    listener.close()


def test_the_consumer_gives_up_on_a_silent_node_with_its_transport_error(silent_node):
    consumer = RabbitMQConsumer(silent_node)
    began = time.monotonic()

    with pytest.raises(TransportUnavailable):
        consumer.start(["default"], 4)

    assert time.monotonic() - began < CONNECT_TIMEOUT * 3


def test_the_dead_letter_box_gives_up_on_a_silent_node_with_its_transport_error(
    silent_node, settings
):
    from worker.dead_letters import dead_letters_list

    settings.BROKER = "rabbitmq"
    settings.RABBITMQ_URL = silent_node

    with pytest.raises(TransportUnavailable):
        dead_letters_list(["default"], limit=1)


def test_the_box_itself_raises_pikas_own_family(silent_node):
    import pika

    with pytest.raises(pika.exceptions.AMQPError):
        RabbitMQDeadLetterBox(silent_node)
