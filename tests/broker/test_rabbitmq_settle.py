"""A settlement the RabbitMQ I/O thread never runs is an unavailable broker, not a crash."""

from __future__ import annotations

import threading

import pytest

from broker.base import TransportUnavailable
from broker.rabbitmq import consumer as consume_rabbitmq
from broker.rabbitmq.consumer import RabbitMQConsumer


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
