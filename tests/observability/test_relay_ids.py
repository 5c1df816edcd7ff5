"""The relay's own work outside any row (its schedule checks) gets an id per check, and
leaves none behind for the lines that follow."""

from __future__ import annotations

from io import StringIO

import pytest

from common.context import current_correlation_id
from outbox.models import PlatformOutboxMessage
from relay.management.commands.run_relay import Command

pytestmark = pytest.mark.django_db


def test_a_schedule_check_gives_what_it_enqueues_an_id_of_its_own_and_keeps_none():
    # (Whatever an earlier test left bound in this thread stays as it was.)
    before = current_correlation_id()

    enqueued = Command(stdout=StringIO(), stderr=StringIO()).enqueue_due_schedules()

    assert enqueued, "no schedule was due in a fresh database"
    ids = {row.envelope["correlation_id"] for row in PlatformOutboxMessage.objects.all()}
    assert len(ids) == 1 and ids != {""} and ids != {before}
    assert current_correlation_id() == before
