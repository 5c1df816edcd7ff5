"""The relay's RabbitMQ connection across idle periods longer than its heartbeat."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.db import transaction

from outbox.services import dispatch
from relay.management.commands.run_relay import Command

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_message_after_an_idle_spell_longer_than_the_heartbeat_is_sent_at_the_first_try(
    settings, rabbit
):
    # A one-second heartbeat: the broker drops a client silent for a few seconds. The relay
    # is silent whenever the outbox is empty (it waits on Redis, not on the broker).
    settings.RABBITMQ_URL = f"{settings.RABBITMQ_URL}?heartbeat=1"
    command = Command(stdout=StringIO(), stderr=StringIO())
    with transaction.atomic():
        dispatch("maintenance.purge", {"n": 1})
    command.relay_one_batch()
    assert command.relay.outages == 0

    time.sleep(5)  # idle, as on a quiet night; no assertion depends on this being exact
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {"n": 2})
    command.relay_one_batch()

    assert command.relay.outages == 0, "the first batch after an idle spell found a dead connection"
    received = {envelope["run_id"] for _, envelope in rabbit.take_all("maintenance")}
    assert str(run_id) in received
    command.relay.close()
