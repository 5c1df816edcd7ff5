"""A broker that refuses one message, or lost its definitions, is not an outage.

Against a private RabbitMQ node with ``max_message_size`` 64 KiB: a message over it makes
the broker close the channel. That message alone backs off; the rows before it are sent
once, the rows after it and the other table go on. A node reset to empty answers
``404 NOT_FOUND``: the relay declares its topology again and sends.
"""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from io import StringIO

import pika.exceptions
import pytest
from botocore.exceptions import ClientError
from django.db import transaction
from django.db.models import F

from broker import OutgoingMessage, SendResult
from broker.sqs.publisher import SQSTransport, batch_entries
from outbox.models import OutboxMessage, PlatformOutboxMessage
from outbox.services import dispatch, publish
from relay.management.commands.run_relay import Command
from tests.factories import TenantFactory
from tests.polling import wait_until
from tests.relay.conftest import RabbitConsumer, run_ids, take_all_sqs

pytestmark = pytest.mark.django_db(transaction=True)

MAX_MESSAGE_SIZE = 64 * 1024


@pytest.fixture(scope="module")
def small_broker(private_rabbitmq_factory):
    """A private node that refuses messages over 64 KiB by closing the channel."""
    return private_rabbitmq_factory(config={"max_message_size": str(MAX_MESSAGE_SIZE)})


@pytest.fixture
def on_small_broker(settings, small_broker):
    small_broker.start()
    settings.RABBITMQ_URL = small_broker.url
    consumer = RabbitConsumer(small_broker.url)
    yield consumer
    with contextlib.suppress(pika.exceptions.AMQPError):
        consumer.close()


def relay_command() -> Command:
    return Command(stdout=StringIO(), stderr=StringIO())


def passes_until(command: Command, done, timeout: float = 20.0) -> None:
    """Relay passes (no waiting in between: that is the daemon's business) until done."""

    def one_pass():
        command.relay_one_batch()
        return done()

    wait_until(one_pass, timeout=timeout, message="the relay to get there", interval=0.05)


def test_a_message_over_the_brokers_size_limit_backs_off_alone_and_the_others_go_once(
    on_small_broker, settings
):
    # The refused row stays out of the later passes, however slow the machine (the default
    # backoff, 1 s, can end before they do, and the row would be tried again).
    settings.RELAY_RETRY_BACKOFF = 60
    tenant = TenantFactory()
    with transaction.atomic():
        before = [dispatch("maintenance.purge", {"n": n}) for n in range(5)]
        poison = dispatch("maintenance.purge", {"blob": "x" * 100 * 1024})
        after = [dispatch("maintenance.purge", {"n": n}) for n in range(300)]
    command = relay_command()

    command.relay_one_batch()
    with transaction.atomic():
        for job_id in range(5):
            publish(
                "JobCreated",
                {"automation_id": 5, "job_id": job_id},
                tenant=tenant,
                aggregate=("Job", job_id),
            )
    passes_until(
        command,
        lambda: (
            not PlatformOutboxMessage.objects.filter(sent_at__isnull=True)
            .exclude(run_id=poison)
            .exists()
            and not OutboxMessage.objects.filter(sent_at__isnull=True).exists()
        ),
    )

    # Every good row reached the queue exactly once; the big one did not.
    received = run_ids(env for _, env in on_small_broker.take_all("maintenance"))
    assert set(received) == {str(r) for r in before + after}
    # Those after it never reached the broker before the close: once. Those before it may
    # have been taken while their confirms were lost with the channel: at most once again.
    assert {received[str(r)] for r in after} == {1}
    assert max(received[str(r)] for r in before) <= 2
    assert len(on_small_broker.take_all("automation-5")) == 5
    bad = PlatformOutboxMessage.objects.annotate(wait=F("available_at") - F("created_at")).get(
        run_id=poison
    )
    assert bad.sent_at is None and bad.attempts == 1
    assert bad.wait.total_seconds() >= 0.5
    # A refusal of one message is not an outage.
    assert command.relay.outages == 0
    assert not PlatformOutboxMessage.objects.exclude(run_id=poison).exclude(attempts=0).exists()


def test_two_refused_messages_in_one_batch_each_back_off_and_the_rest_is_sent(on_small_broker):
    with transaction.atomic():
        good = [dispatch("maintenance.purge", {"n": n}) for n in range(20)]
        bad = [dispatch("maintenance.purge", {"blob": "y" * 70 * 1024, "n": n}) for n in range(2)]
        good += [dispatch("maintenance.purge", {"n": n}) for n in range(20, 40)]
    command = relay_command()

    passes_until(
        command,
        lambda: PlatformOutboxMessage.objects.filter(sent_at__isnull=False).count() == 40,
    )

    received = run_ids(env for _, env in on_small_broker.take_all("maintenance"))
    assert set(received) == {str(r) for r in good}
    # At most once again for those in flight when a close lost their confirms.
    assert max(received.values()) <= 2
    assert {received[str(r)] for r in good[20:]} == {1}
    rows = PlatformOutboxMessage.objects.filter(run_id__in=bad)
    assert [(r.sent_at, r.attempts) for r in rows] == [(None, 1), (None, 1)]
    assert command.relay.outages == 0


def test_a_batch_of_nothing_but_refused_messages_backs_each_off(on_small_broker):
    with transaction.atomic():
        bad = [dispatch("maintenance.purge", {"blob": "z" * 70 * 1024, "n": n}) for n in range(3)]
    command = relay_command()

    passes_until(command, lambda: not PlatformOutboxMessage.objects.filter(attempts=0).exists())

    rows = PlatformOutboxMessage.objects.filter(run_id__in=bad)
    assert Counter((r.sent_at, r.attempts) for r in rows) == {(None, 1): 3}
    assert all(r.available_at > r.created_at for r in rows)


def test_after_the_exchange_vanished_under_an_open_connection_the_relay_declares_it_and_sends(
    settings, on_small_broker
):
    command = relay_command()
    with transaction.atomic():
        first = dispatch("maintenance.purge", {"n": 1})
    passes_until(command, lambda: PlatformOutboxMessage.objects.get(run_id=first).sent_at)
    channel = on_small_broker.connection.channel()
    channel.exchange_delete(settings.RABBITMQ_EXCHANGE)
    channel.close()

    with transaction.atomic():
        second = dispatch("maintenance.purge", {"n": 2})
    command.relay_one_batch()

    # The same pass: the 404 made it declare the exchange again and send the row again.
    row = PlatformOutboxMessage.objects.get(run_id=second)
    assert row.sent_at is not None and row.attempts == 0
    assert command.relay.outages == 0
    received = [env["run_id"] for _, env in on_small_broker.take_all("maintenance")]
    assert received == [str(first), str(second)]


def test_after_a_broker_reset_to_empty_the_relay_declares_its_topology_again(
    small_broker, on_small_broker
):
    command = relay_command()
    with transaction.atomic():
        first = dispatch("maintenance.purge", {"n": 1})
    passes_until(command, lambda: PlatformOutboxMessage.objects.get(run_id=first).sent_at)
    on_small_broker.close()

    small_broker.reset()
    with transaction.atomic():
        second = dispatch("maintenance.purge", {"n": 2})
        job_available = dispatch("maintenance.purge", {"n": 3})
    passes_until(
        command, lambda: not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()
    )

    # Exchange, queue and binding exist again: the rows reached their queue.
    consumer = RabbitConsumer(small_broker.url)
    try:
        received = sorted(env["run_id"] for _, env in consumer.take_all("maintenance"))
    finally:
        consumer.close()
    assert received == sorted([str(second), str(job_available)])


def test_an_sqs_call_refused_as_a_whole_is_split_not_blamed_on_every_entry(sqs):
    with transaction.atomic():
        run_ids_sent = [
            dispatch("maintenance.purge", {"blob": "x" * (100 * 1024), "n": n}) for n in range(3)
        ]
    transport = SQSTransport()
    url = transport.queue_url("maintenance")
    calls = []

    # What SQS does with a call over its limit (the local endpoint does not check it):
    # refuses the whole call, BatchRequestTooLong. Here the limit is 150 KiB, as a lower
    # quota or a size counted differently would make it.
    def refuse_long_calls(params, **_):
        calls.append(len(params["Entries"]))
        if sum(len(e["MessageBody"]) for e in params["Entries"]) > 150 * 1024:
            raise ClientError(
                {
                    "Error": {"Code": "AWS.SimpleQueueService.BatchRequestTooLong"},
                    "ResponseMetadata": {"HTTPStatusCode": 400},
                },
                "SendMessageBatch",
            )

    transport.client.meta.events.register(
        "provide-client-params.sqs.SendMessageBatch", refuse_long_calls
    )
    messages = [_outgoing(row) for row in PlatformOutboxMessage.objects.order_by("id")]
    result = SendResult()
    for call in batch_entries(messages):
        transport._send_call(url, call, result)
    transport.close()

    assert result.rejected == {}
    assert sorted(result.sent) == sorted(m.key for m in messages)
    # Two entries in the first call (batch_entries' 256 KiB), refused, then one by one.
    assert calls[:3] == [2, 1, 1]
    received = run_ids(take_all_sqs(sqs, "maintenance"))
    assert set(received) == {str(r) for r in run_ids_sent}
    assert set(received.values()) == {1}


def _outgoing(row):
    envelope = row.envelope
    return OutgoingMessage(
        key=row.id,
        run_id=str(row.run_id),
        destination=envelope["destination"],
        task=envelope["task"],
        body=json.dumps(envelope).encode(),
        correlation_id=envelope.get("correlation_id") or "",
    )
