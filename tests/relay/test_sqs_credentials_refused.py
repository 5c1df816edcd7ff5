"""Credentials SQS no longer takes (a session token expired, a key rotated away) stop
every call, whatever it carries: an outage, not a refusal of each message.

Taken for refusals, each call was cut in halves down to single entries (19 calls for
10 rows), every row backed off up to ``RELAY_RETRY_BACKOFF_MAX`` with a broker refusal
noted on its run, and the relay reported the broker reachable. moto's server takes any
credentials, so SQS's answer is given at the client boundary.
"""

from __future__ import annotations

from io import StringIO

import pytest
from botocore.exceptions import ClientError
from django.db import transaction
from django.db.models.functions import Now

from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.services import dispatch
from relay.management.commands.run_relay import Command
from tests.relay.conftest import run_ids, take_all_sqs

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("code", "status"),
    [
        ("ExpiredToken", 400),
        ("InvalidClientTokenId", 403),
        ("SignatureDoesNotMatch", 403),
        ("UnrecognizedClientException", 400),
    ],
)
def test_credentials_sqs_refuses_make_an_outage_and_the_rows_go_once_they_are_good(
    sqs, code, status
):
    with transaction.atomic():
        sent = [dispatch("maintenance.purge", {"n": n}) for n in range(10)]
    command = Command(stdout=StringIO(), stderr=StringIO())
    client = command.relay.transport.client
    command.relay.transport.queue_url("maintenance")
    calls = []
    refusing = [True]

    def refuse(params, **_):
        calls.append(len(params["Entries"]))
        if refusing[0]:
            raise ClientError(
                {
                    "Error": {"Code": code, "Message": "The security token is invalid."},
                    "ResponseMetadata": {"HTTPStatusCode": status},
                },
                "SendMessageBatch",
            )

    client.meta.events.register("provide-client-params.sqs.SendMessageBatch", refuse)

    command.relay_one_batch()

    assert calls == [10]
    assert command.relay.outages == 1
    rows = PlatformOutboxMessage.objects.filter(run_id__in=sent)
    assert {(row.sent_at, row.attempts) for row in rows} == {(None, 1)}
    assert not rows.filter(available_at__gt=Now()).exists()
    assert not TaskRun.objects.filter(run_id__in=sent, last_error__startswith="Refused").exists()

    refusing[0] = False
    command.relay_one_batch()

    assert command.relay.outages == 0
    assert not rows.filter(sent_at__isnull=True).exists()
    received = run_ids(take_all_sqs(sqs, "maintenance"))
    assert set(received) == {str(r) for r in sent} and set(received.values()) == {1}
