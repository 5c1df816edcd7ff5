"""A RabbitMQ worker's window is split across its queues' consumers, each share within what
the protocol's ``basic.qos`` carries."""

from __future__ import annotations

import pytest

from broker.rabbitmq.consumer import MAX_PREFETCH_COUNT, RabbitMQConsumer, prefetch_shares
from tests.broker.conftest import publish_confirmed
from tests.polling import wait_until


@pytest.mark.parametrize(
    ("prefetch", "consumers", "shares"),
    [
        (64, 4, [16, 16, 16, 16]),
        (10, 4, [3, 3, 2, 2]),
        (2, 4, [1, 1, 1, 1]),  # a share of 0 would be no limit at all
        (64, 1, [64]),
        (200_000, 2, [MAX_PREFETCH_COUNT, MAX_PREFETCH_COUNT]),
        (64, 0, []),
    ],
)
def test_the_window_is_shared_across_the_consumers(prefetch, consumers, shares):
    assert prefetch_shares(prefetch, consumers) == shares


def test_a_window_beyond_what_basic_qos_carries_still_consumes(settings, default_queue):
    """A window of 70,000 on one queue (``WORKER_CONCURRENCY`` 4,375 at 16 a slot) is held
    at 65,535, not a ``struct.error`` out of pika at every start."""
    consumer = RabbitMQConsumer()
    try:
        consumer.start(["default"], prefetch=70_000)
        publish_confirmed(settings.RABBITMQ_URL, default_queue, [b"one message"])
        received: list = []
        wait_until(lambda: received.extend(consumer.poll(0.1)) or received, timeout=30)
        assert [delivery.body for delivery in received] == [b"one message"]
    finally:
        consumer.close()
