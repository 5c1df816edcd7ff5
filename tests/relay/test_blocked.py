"""A broker that protects itself is not a broker that is gone.

A memory alarm on a private RabbitMQ node (its high watermark set to almost nothing) makes
it block every connection that publishes. The relay's batch is held on the same
connection, for far longer than the wait for an answer, then confirmed once the alarm
clears: no reconnect, no message published twice, and the log and the gauge say blocked.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from io import StringIO

import pika.exceptions
import pytest
from django import db
from django.db import transaction

from broker.metrics import PUBLISHING_BLOCKED
from broker.rabbitmq import publisher
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from relay.management.commands.run_relay import Command
from tests.polling import wait_until
from tests.relay.conftest import RabbitConsumer, run_ids

pytestmark = pytest.mark.django_db(transaction=True)

# The wait for a batch's answers, short here so that the alarm outlasts it several times.
ANSWER_TIMEOUT = 2.0


@pytest.fixture
def alarmed(settings, running_private_rabbitmq, monkeypatch):
    """The relay pointed at a private node; ``raise_alarm()`` / ``clear_alarm()``."""
    node = running_private_rabbitmq
    settings.RABBITMQ_URL = node.url

    class Alarm:
        def raise_alarm(self) -> None:
            # Short from now on (the first batch, before it, keeps the usual wait).
            monkeypatch.setattr(publisher, "ANSWER_TIMEOUT", ANSWER_TIMEOUT)
            node.ctl("set_vm_memory_high_watermark", "0.000001")

        def clear_alarm(self) -> None:
            node.ctl("set_vm_memory_high_watermark", "0.4")

    alarm = Alarm()
    consumer = RabbitConsumer(node.url)
    try:
        yield alarm, consumer
    finally:
        alarm.clear_alarm()
        with contextlib.suppress(pika.exceptions.AMQPError):
            consumer.close()


def test_a_memory_alarm_holds_the_batch_on_its_connection_and_sends_each_message_once(
    alarmed, caplog
):
    alarm, consumer = alarmed
    command = Command(stdout=StringIO(), stderr=StringIO())
    # The topology declared and the connection open before the alarm.
    with transaction.atomic():
        first = dispatch("maintenance.purge", {"n": -1})
    command.relay_one_batch()
    with transaction.atomic():
        held = [dispatch("maintenance.purge", {"n": n}) for n in range(200)]
    connection = command.relay.transport._conn

    alarm.raise_alarm()

    def one_pass() -> None:
        try:
            command.relay_one_batch()
        finally:
            db.connection.close()

    relaying = threading.Thread(target=one_pass, name="blocked-relay")
    with caplog.at_level(logging.INFO, logger="hubdommed.relay"):
        relaying.start()
        wait_until(
            lambda: PUBLISHING_BLOCKED._value.get() == 1 or not relaying.is_alive(),
            timeout=30,
            message="the relay's connection blocked",
        )
        # Several answer timeouts long, the batch is still waiting on its connection (it
        # used to give up after one, reconnect and publish the batch again).
        time.sleep(ANSWER_TIMEOUT * 3)
        assert relaying.is_alive(), caplog.text
        assert PUBLISHING_BLOCKED._value.get() == 1
        alarm.clear_alarm()
        relaying.join(timeout=60)
    assert not relaying.is_alive()

    assert PUBLISHING_BLOCKED._value.get() == 0
    assert command.relay.transport._conn is connection
    assert command.relay.outages == 0
    assert "RabbitMQ blocked this connection" in caplog.text
    assert "RabbitMQ unblocked this connection" in caplog.text
    assert "reconnecting" not in caplog.text
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()
    received = run_ids(envelope for _, envelope in consumer.take_all("maintenance"))
    assert set(received) == {str(run_id) for run_id in [first, *held]}
    assert set(received.values()) == {1}
