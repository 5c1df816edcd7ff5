"""What PostgreSQL holds and SQS would refuse, sent anyway: the relay's rows never back off
for ever over a character or a separator.

SQS takes in a message body and in attribute strings only tab, LF, CR, U+0020 to U+D7FF,
U+E000 to U+FFFD and U+10000 to U+10FFFF; PostgreSQL writes U+FFFE and U+FFFF in a jsonb
document as they are. moto's server does not check characters, so the check SQS makes is
emulated at the client boundary. A queue's ``MaximumMessageSize`` moto does check: a
queue made before SQS's limit grew keeps 256 KiB, and ``envelope::text`` spells each
separator with a space that ``dispatch`` did not count.
"""

from __future__ import annotations

import json
import re
from io import StringIO

import pytest
from botocore.exceptions import ClientError
from django.db import transaction

from broker import topology
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from relay.management.commands.run_relay import Command
from tests.relay.conftest import drain, take_all_sqs

pytestmark = pytest.mark.django_db(transaction=True)

REFUSED_BY_SQS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def relay_command() -> Command:
    return Command(stdout=StringIO(), stderr=StringIO())


def refuse_what_sqs_refuses(client) -> None:
    """SQS's answer to a body or attribute holding a character outside its set: the call
    refused, InvalidMessageContents."""

    def check(params, **_):
        for entry in params["Entries"]:
            texts = [entry["MessageBody"]] + [
                value.get("StringValue", "")
                for value in entry.get("MessageAttributes", {}).values()
            ]
            if any(REFUSED_BY_SQS.search(text) for text in texts):
                raise ClientError(
                    {
                        "Error": {"Code": "InvalidMessageContents", "Message": "invalid chars"},
                        "ResponseMetadata": {"HTTPStatusCode": 400},
                    },
                    "SendMessageBatch",
                )

    client.meta.events.register("provide-client-params.sqs.SendMessageBatch", check)


def test_text_sqs_refuses_in_a_body_is_escaped_and_arrives_unchanged(sqs):
    odd = "a\ufffeb\uffffc \u2028 \U0001f600 tab\tend"
    with transaction.atomic():
        plain = dispatch("maintenance.purge", {"n": 1})
        oddity = dispatch("maintenance.purge", {"text": odd, odd: "as a key"})
    command = relay_command()
    refuse_what_sqs_refuses(command.relay.transport.client)

    drain(command)

    rows = {str(row.run_id): row for row in PlatformOutboxMessage.objects.all()}
    assert rows[str(oddity)].sent_at is not None and rows[str(oddity)].attempts == 0
    assert rows[str(plain)].sent_at is not None
    received = {envelope["run_id"]: envelope for envelope in take_all_sqs(sqs, "maintenance")}
    assert received[str(oddity)]["payload"] == {"text": odd, odd: "as a key"}
    assert received[str(oddity)] == rows[str(oddity)].envelope


def test_an_envelope_dispatch_accepted_fits_a_queue_of_256_kib_though_jsonb_spells_it_longer(
    sqs, settings
):
    # Compact, as dispatch counts it, under the limit; as PostgreSQL writes it back
    # (a space after each comma and colon), over it by half.
    items = list(range(9)) * 13_000
    with transaction.atomic():
        big = dispatch("maintenance.purge", {"items": items, "kinds": {"a": 1, "b": [1, 2]}})
    row = PlatformOutboxMessage.objects.get(run_id=big)
    assert len(json.dumps(row.envelope, separators=(",", ":")).encode()) <= 256 * 1024
    command = relay_command()
    transport = command.relay.transport
    url = transport.queue_url("maintenance")
    sqs.set_queue_attributes(QueueUrl=url, Attributes={"MaximumMessageSize": str(256 * 1024)})

    drain(command)

    row.refresh_from_db()
    assert row.sent_at is not None and row.attempts == 0
    (received,) = take_all_sqs(sqs, "maintenance")
    assert received == row.envelope
    assert topology.queue_name("maintenance") in url
