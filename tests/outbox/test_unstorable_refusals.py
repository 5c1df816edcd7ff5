"""The broker's reason for refusing a message is the broker's text (or a library's): with
U+0000 or a lone surrogate in it, it is noted on the run with U+FFFD in their place, and
the batch's record (its sent rows among them) commits, instead of failing whole and
sending every row of it again."""

from __future__ import annotations

import pytest
from django.db import transaction

from broker import SendResult
from outbox.delivery import due_batch
from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.services import dispatch

pytestmark = pytest.mark.django_db

TABLE = PlatformOutboxMessage._meta.db_table


def test_a_refusal_whose_reason_holds_unstorable_text_is_noted_and_the_batch_recorded():
    with transaction.atomic():
        refused = str(dispatch("maintenance.purge", {"n": 1}))
        accepted = str(dispatch("maintenance.purge", {"n": 2}))

    with due_batch(TABLE, 10) as batch:
        keys = {message.run_id: message.key for message in batch.messages}
        batch.record(
            SendResult(
                sent=[keys[accepted]],
                rejected={keys[refused]: "invalid header a\x00b\ud800c"},
            )
        )

    assert TaskRun.objects.get(run_id=refused).last_error == (
        "Refused by the broker: invalid header a\ufffdb\ufffdc"
    )
    assert PlatformOutboxMessage.objects.get(run_id=refused).attempts == 1
    assert PlatformOutboxMessage.objects.get(run_id=accepted).sent_at is not None
