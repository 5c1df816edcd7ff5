"""Fixtures of the stuck-job monitor's tests: jobs stuck in each way, and the power-ons sent."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.utils import timezone

from job.management.commands.watch_stuck_jobs import Command
from outbox.models import OutboxMessage, PlatformOutboxMessage
from tests.factories import AutomationFactory, JobFactory, RunningJobFactory, WorkerFactory
from tests.job.support import worker_client


@pytest.fixture
def monitor():
    return Command(stdout=StringIO(), stderr=StringIO())


@pytest.fixture
def worker(db):
    return WorkerFactory(automation=AutomationFactory(max_attempts=2))


@pytest.fixture
def worker_api(worker):
    return worker_client(worker)


@pytest.fixture
def pending_for(settings):
    """A job pending for ``seconds`` (created then, and pending ever since)."""
    settings.MONITOR_PENDING_SECONDS = 180

    def make(seconds: float, **fields):
        since = timezone.now() - timedelta(seconds=seconds)
        return JobFactory(created_at=since, updated_at=since, **fields)

    return make


@pytest.fixture
def lost():
    """A running job whose lease expired a while ago: its worker stopped heartbeating."""

    def make(**fields):
        started = timezone.now() - timedelta(minutes=5)
        return RunningJobFactory(
            started_at=started, lease_expires_at=started + timedelta(seconds=60), **fields
        )

    return make


def power_ons(model=PlatformOutboxMessage) -> list[int]:
    """The automation ids of the machines.power_on runs written to the outbox, sorted."""
    return sorted(
        row.envelope["payload"]["automation_id"]
        for row in model.objects.filter(envelope__task="machines.power_on")
    )


def tenant_power_ons() -> list[int]:
    return power_ons(OutboxMessage)
