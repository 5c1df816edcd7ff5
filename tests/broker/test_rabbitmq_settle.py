"""A settlement the RabbitMQ I/O thread never runs is an unavailable broker, not a crash."""

from __future__ import annotations

import threading

import pika
import pytest

from broker.base import TransportUnavailable
from broker.rabbitmq import consumer as consume_rabbitmq
from broker.rabbitmq.consumer import RabbitMQConsumer
from tests.broker.conftest import publish_confirmed
from tests.forwarding import Forwarder
from tests.polling import wait_until


@pytest.fixture
def consumer(settings, exchange_name):
    settings.RABBITMQ_EXCHANGE = exchange_name
    consumer = RabbitMQConsumer()
    consumer.start([], prefetch=1)
    yield consumer
    consumer.close()


def test_a_settlement_left_unanswered_raises_transport_unavailable(consumer, monkeypatch):
    monkeypatch.setattr(consume_rabbitmq, "SETTLE_TIMEOUT", 0.3)
    errors: list[BaseException] = []

    def from_a_worker_thread():
        try:
            # The I/O thread (this test's main thread) never polls, as after a reconnect.
            consumer._on_io_thread(lambda: "settled")
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=from_a_worker_thread)
    thread.start()
    thread.join(timeout=10)

    assert len(errors) == 1
    assert isinstance(errors[0], TransportUnavailable)


def test_acks_of_a_group_cover_only_its_own_messages(settings, default_queue):
    """One ``multiple`` ack for the lowest run of tags the group holds, single acks for the
    rest: a message between them, still being worked on, stays unacked (and comes back
    when the connection goes)."""
    queue = default_queue
    consumer = RabbitMQConsumer()
    consumer.start(["default"], prefetch=10)
    try:
        publish_confirmed(
            settings.RABBITMQ_URL, queue, [f"message {number}".encode() for number in range(6)]
        )
        received = []
        wait_until(
            lambda: received.extend(consumer.poll(0.1)) or len(received) == 6,
            timeout=30,
            message=lambda: f"{len(received)} of 6 received",
        )
        held = received[3]
        group = [received[number] for number in (4, 0, 2, 1, 5)]
        done = threading.Event()
        failed: list = []

        def ack_from_a_worker_thread():
            failed.extend(consumer.ack_many(group))
            done.set()

        threading.Thread(target=ack_from_a_worker_thread).start()
        wait_until(lambda: consumer.poll(0.05) is not None and done.is_set(), timeout=10)
        assert failed == []
        assert consumer._unacked == {held.receipt}
    finally:
        consumer.close()

    # The connection is gone: only the message the group did not hold comes back.
    again = RabbitMQConsumer()
    again.start(["default"], prefetch=10)
    try:
        back: list = []
        wait_until(lambda: back.extend(again.poll(0.1)) or back, timeout=10)
        again.poll(0.3)
        back.extend(again.poll(0.3))
        assert [delivery.body for delivery in back] == [b"message 3"]
    finally:
        again.close()


def test_a_connection_lost_under_an_ack_is_unavailable_at_the_next_poll(settings, default_queue):
    """An ack that meets a cut connection breaks it inside pika's I/O loop; the next
    poll is then a lost connection (the worker reconnects), never pika's own error about
    its closed timers."""
    queue = default_queue
    broker_url = settings.RABBITMQ_URL
    broker = pika.URLParameters(broker_url)
    forwarder = Forwarder((broker.host, broker.port)).open()
    settings.RABBITMQ_URL = (
        f"amqp://{broker.credentials.username}:{broker.credentials.password}"
        f"@127.0.0.1:{forwarder.port}/%2F"
    )
    consumer = RabbitMQConsumer()
    consumer.start(["default"], prefetch=10)
    try:
        publish_confirmed(broker_url, queue, [f"message {number}".encode() for number in range(3)])
        received = []
        wait_until(
            lambda: received.extend(consumer.poll(0.1)) or len(received) == 3,
            timeout=30,
            message=lambda: f"{len(received)} of 3 received",
        )

        forwarder.close()
        # On the I/O thread, as when a worker thread's ack is run by the poll: pika finds
        # the stream lost while it writes the ack.
        assert consumer.ack_many(received) == received
        with pytest.raises(TransportUnavailable):
            consumer.poll(0.05)
    finally:
        consumer.close()
        forwarder.close()
