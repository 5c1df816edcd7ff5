"""Step 1: jobs pending past the threshold get their machine powered on again."""

from __future__ import annotations

import pytest
from django.utils import timezone

from job.models import Job
from job.services import job_cancel
from outbox.models import PlatformOutboxMessage
from tests.factories import AutomationFactory
from tests.monitor.conftest import power_ons

pytestmark = pytest.mark.django_db


def test_a_job_pending_past_the_threshold_gets_one_more_power_on(monitor, pending_for):
    job = pending_for(181)

    assert monitor.power_on_for_pending() == 1

    assert power_ons() == [job.automation_id]
    envelope = PlatformOutboxMessage.objects.get(envelope__task="machines.power_on").envelope
    assert envelope["queue"] == "critical" and envelope["tenant"] is None
    assert envelope["payload"] == {"automation_id": job.automation_id}


def test_several_stuck_jobs_of_one_automation_get_a_single_power_on_per_cycle(monitor, pending_for):
    automation = AutomationFactory()
    for _ in range(3):
        pending_for(300, automation=automation)

    assert monitor.power_on_for_pending() == 1

    assert power_ons() == [automation.id]


def test_two_automations_with_stuck_jobs_get_one_power_on_each(monitor, pending_for):
    first, second = AutomationFactory(), AutomationFactory()
    pending_for(300, automation=first)
    pending_for(200, automation=second)
    pending_for(400, automation=second)

    assert monitor.power_on_for_pending() == 2

    assert power_ons() == sorted([first.id, second.id])


def test_each_cycle_sends_its_own_power_on_while_the_job_still_waits(monitor, pending_for):
    job = pending_for(300)

    monitor.power_on_for_pending()
    monitor.power_on_for_pending()

    assert power_ons() == [job.automation_id, job.automation_id]


def test_a_fresh_pending_job_gets_no_power_on(monitor, pending_for):
    pending_for(60)

    assert monitor.power_on_for_pending() == 0

    assert power_ons() == []


def test_jobs_no_longer_pending_get_no_power_on(monitor, pending_for, user):
    canceled = pending_for(300, tenant=user.tenant)
    job_cancel(tenant=user.tenant, job_id=canceled.id, actor=user)
    pending_for(300, status=Job.Status.SUCCEEDED)

    assert monitor.power_on_for_pending() == 0


def test_an_inactive_automations_stuck_job_gets_no_power_on(monitor, pending_for):
    pending_for(300, automation=AutomationFactory(is_active=False))

    assert monitor.power_on_for_pending() == 0

    assert power_ons() == []


def test_a_job_put_back_to_pending_waits_the_threshold_again(monitor, pending_for):
    job = pending_for(3600)
    # Requeued just now: its wait starts over, however old the job.
    Job.objects.filter(pk=job.pk).update(updated_at=timezone.now())

    assert monitor.power_on_for_pending() == 0
