"""The monitor restarts a worker that stays silent while its automation has jobs waiting."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from automation.models import Worker
from outbox.models import PlatformOutboxMessage
from tests.factories import JobFactory, WorkerFactory


def restarts() -> list[dict]:
    return [
        row.envelope["payload"]
        for row in PlatformOutboxMessage.objects.filter(envelope__task="machines.restart")
    ]


@pytest.mark.django_db
def test_the_monitor_restarts_a_silent_worker_whose_automation_has_jobs_waiting(monitor, settings):
    settings.MONITOR_WORKER_SILENT_SECONDS = 60
    long_ago = timezone.now() - timedelta(minutes=5)
    silent = WorkerFactory()
    Worker.objects.filter(pk=silent.pk).update(last_seen_at=long_ago, updated_at=long_ago)
    JobFactory(automation=silent.automation, created_at=long_ago, updated_at=long_ago)
    talking = WorkerFactory()
    Worker.objects.filter(pk=talking.pk).update(last_seen_at=timezone.now())
    JobFactory(automation=talking.automation, created_at=long_ago, updated_at=long_ago)
    idle = WorkerFactory()  # silent, but nothing waits for it
    Worker.objects.filter(pk=idle.pk).update(last_seen_at=long_ago, updated_at=long_ago)

    assert monitor.restart_silent_workers() == 1

    (payload,) = restarts()
    assert payload["automation_id"] == silent.automation_id
    assert payload["silent_since"]


@pytest.mark.django_db
def test_a_cycle_counts_the_restarts_it_asked_for(monitor, settings):
    settings.MONITOR_WORKER_SILENT_SECONDS = 60
    long_ago = timezone.now() - timedelta(minutes=5)
    silent = WorkerFactory()
    Worker.objects.filter(pk=silent.pk).update(last_seen_at=None, updated_at=long_ago)
    JobFactory(automation=silent.automation, created_at=long_ago, updated_at=long_ago)

    counts = monitor.run_cycle()

    assert counts.workers_restarted == 1
    assert [p["automation_id"] for p in restarts()] == [silent.automation_id]
