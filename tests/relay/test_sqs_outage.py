"""The SQS endpoint going away and coming back: an outage, not a refusal.

The test's own moto server on loopback, stopped and started again on the same port (its
queues live in the process, so they are there again, as SQS's are after an outage). While
it is away the rows stay due, not backed off; once it is back each arrives once.
"""

from __future__ import annotations

from io import StringIO

import pytest
from django.db import transaction
from django.db.models.functions import Now

from broker.sqs.publisher import sqs_client
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from relay.management.commands.run_relay import Command
from tests.polling import wait_until
from tests.relay.conftest import run_ids, take_all_sqs

pytestmark = pytest.mark.django_db(transaction=True)


def relay_command() -> Command:
    return Command(stdout=StringIO(), stderr=StringIO())


def test_rows_wait_out_an_sqs_outage_unpushed_and_arrive_once_when_it_ends(private_sqs):
    command = relay_command()
    with transaction.atomic():
        before = [dispatch("maintenance.purge", {"n": n}) for n in range(3)]
    command.relay_one_batch()
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()

    private_sqs.stop()
    with transaction.atomic():
        during = [dispatch("maintenance.purge", {"n": n}) for n in range(12)]
    command.relay_one_batch()

    rows = PlatformOutboxMessage.objects.filter(run_id__in=during)
    assert command.relay.outages == 1
    # Not the rows' fault: counted, but due as before (no backoff).
    assert {(row.sent_at, row.attempts) for row in rows} == {(None, 1)}
    assert not rows.filter(available_at__gt=Now()).exists()

    private_sqs.start()

    def passes() -> bool:
        command.relay_one_batch()
        return not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()

    wait_until(passes, timeout=30, message="the backlog to drain", interval=0.05)
    assert command.relay.outages == 0
    client = sqs_client()
    try:
        received = run_ids(take_all_sqs(client, "maintenance"))
    finally:
        client.close()
    assert set(received) == {str(r) for r in before + during}
    assert set(received.values()) == {1}
