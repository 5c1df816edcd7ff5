"""The relay over SQS (moto's server on loopback): queues, limits, partial failures."""

from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction

from broker import topology
from broker.sqs.publisher import MAX_BATCH_BYTES, MAX_BATCH_ENTRIES
from outbox.models import OutboxMessage, PlatformOutboxMessage
from outbox.services import dispatch, publish
from relay.management.commands.run_relay import Command
from tests.factories import TenantFactory
from tests.relay.conftest import drain, run_ids, take_all_sqs

pytestmark = pytest.mark.django_db(transaction=True)


def relay_command() -> Command:
    return Command(stdout=StringIO(), stderr=StringIO())


def test_every_committed_row_arrives_exactly_once_over_sqs(sqs):
    tenant = TenantFactory()
    for job_id in range(15):
        with transaction.atomic():
            publish(
                "JobCreated",
                {"automation_id": 5, "job_id": job_id},
                tenant=tenant,
                aggregate=("Job", job_id),
            )
            dispatch("maintenance.purge", {"n": job_id})

    drain(relay_command())

    received = [
        envelope
        for destination in ("critical", "maintenance", "automation-5")
        for envelope in take_all_sqs(sqs, destination)
    ]
    counted = run_ids(received)
    expected = {str(r) for r in OutboxMessage.objects.values_list("run_id", flat=True)} | {
        str(r) for r in PlatformOutboxMessage.objects.values_list("run_id", flat=True)
    }
    assert len(expected) == 45
    assert set(counted) == expected and set(counted.values()) == {1}
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()
    assert not OutboxMessage.objects.filter(sent_at__isnull=True).exists()


def test_setup_broker_creates_each_queue_with_its_dead_letter_queue_and_visibility(sqs):
    call_command("setup_broker", "--automation", "6", stdout=StringIO())
    call_command("setup_broker", stdout=StringIO())  # idempotent

    for destination, visibility in [
        ("critical", 60),
        ("default", 120),
        ("bulk", 900),
        ("maintenance", 300),
        ("automation-6", 60),
    ]:
        url = sqs.get_queue_url(QueueName=topology.queue_name(destination))["QueueUrl"]
        attributes = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]
        redrive = json.loads(attributes["RedrivePolicy"])
        assert attributes["VisibilityTimeout"] == str(visibility)
        assert int(redrive["maxReceiveCount"]) == 7
        assert redrive["deadLetterTargetArn"].endswith(topology.dead_letter_queue_name(destination))


def record_batch_calls(client) -> list[list[dict]]:
    """What each SendMessageBatch call carried, seen through botocore's own events."""
    calls: list[list[dict]] = []
    client.meta.events.register(
        "provide-client-params.sqs.SendMessageBatch",
        lambda params, **_: calls.append(list(params["Entries"])),
    )
    return calls


def entry_bytes(entry: dict) -> int:
    size = len(entry["MessageBody"].encode())
    for name, value in entry.get("MessageAttributes", {}).items():
        size += len(name) + len(value["DataType"]) + len(value["StringValue"].encode())
    return size


def test_an_sqs_batch_respects_both_limits_with_messages_near_256_kib(sqs):
    big = "x" * (250 * 1024)
    with transaction.atomic():
        large = [dispatch("maintenance.purge", {"blob": big, "n": n}) for n in range(3)]
        small = [dispatch("maintenance.purge", {"n": n}) for n in range(25)]
    command = relay_command()
    calls = record_batch_calls(command.relay.transport.client)

    drain(command)

    assert calls, "nothing was sent"
    for entries in calls:
        assert len(entries) <= MAX_BATCH_ENTRIES
        assert sum(entry_bytes(e) for e in entries) <= MAX_BATCH_BYTES
    assert sum(len(entries) for entries in calls) == 28
    received = run_ids(take_all_sqs(sqs, "maintenance"))
    assert set(received) == {str(r) for r in large + small}
    assert set(received.values()) == {1}


def test_entries_sqs_refuses_stay_pending_while_the_others_are_marked_sent(sqs):
    with transaction.atomic():
        run_ids_sent = [dispatch("maintenance.purge", {"n": n}) for n in range(12)]
    command = relay_command()
    client = command.relay.transport.client
    refused = str(run_ids_sent[4])

    # Fault injection at the client boundary: SQS answers this one entry as failed.
    def fail_one_entry(parsed, **_):
        for ok in list(parsed.get("Successful", [])):
            if ok["Id"] == "4":
                parsed["Successful"].remove(ok)
                parsed.setdefault("Failed", []).append(
                    {"Id": "4", "SenderFault": False, "Code": "InternalError", "Message": "x"}
                )

    client.meta.events.register("after-call.sqs.SendMessageBatch", fail_one_entry)

    drain(command)

    rows = {str(r.run_id): r for r in PlatformOutboxMessage.objects.all()}
    assert rows[refused].sent_at is None and rows[refused].attempts == 1
    assert rows[refused].available_at > rows[refused].created_at
    assert all(r.sent_at is not None for key, r in rows.items() if key != refused)
