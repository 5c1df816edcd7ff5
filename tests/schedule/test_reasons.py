"""A schedule's reasons (why it is paused, why it ended) may quote outside text: a
calendar library's message, an automation's schema. Stored as text PostgreSQL takes, or
the pause itself fails and the schedule is neither paused nor moved on."""

from __future__ import annotations

import pytest
from django.utils import timezone

from schedule.models import Schedule
from tests.schedule.support import new_schedule

pytestmark = pytest.mark.django_db

QUOTED = "cannot read 'a\x00b\ud800'"


def test_a_pause_reason_quoting_unstorable_text_is_stored_readable(tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)

    assert schedule.pause(now=timezone.now(), reason=QUOTED)
    schedule.save()

    stored = Schedule.objects.get(pk=schedule.pk)
    assert stored.paused_reason == "cannot read 'a\ufffdb\ufffd'"
    assert stored.next_run_at is None


def test_an_end_reason_quoting_unstorable_text_is_stored_readable(tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)

    schedule.end(now=timezone.now(), reason=QUOTED)
    schedule.save()

    stored = Schedule.objects.get(pk=schedule.pk)
    assert stored.deactivated_reason == "cannot read 'a\ufffdb\ufffd'"
    assert not stored.is_active
