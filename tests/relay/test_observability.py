"""What the relay tells operators: its metrics, a line per batch, a DEBUG line per row with
the row's ids."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction
from prometheus_client import REGISTRY

from common.logs import ContextFilter
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch, publish
from relay.engine import OutboxRelay
from relay.management.commands.run_relay import Command
from tests.factories import TenantFactory
from tests.relay.conftest import insert_pending_rows

pytestmark = pytest.mark.django_db(transaction=True)

PLATFORM = "platform_outbox_messages"
TENANT = "outbox_messages"


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture
def relay():
    relay = OutboxRelay()
    yield relay
    relay.close()


def test_the_relay_counts_batches_and_messages_by_table():
    relay = OutboxRelay(batch_size=10)
    insert_pending_rows(25)
    before = {
        "batches": sample("hubdommed_relay_batches_total", table=PLATFORM),
        "sent": sample("hubdommed_relay_messages_sent_total", table=PLATFORM),
        "observed": sample("hubdommed_relay_batch_duration_seconds_count", table=PLATFORM),
    }

    relay.drain()
    relay.close()

    assert sample("hubdommed_relay_batches_total", table=PLATFORM) - before["batches"] == 3
    assert sample("hubdommed_relay_messages_sent_total", table=PLATFORM) - before["sent"] == 25
    observed = sample("hubdommed_relay_batch_duration_seconds_count", table=PLATFORM)
    assert observed - before["observed"] == 3


def test_refused_and_unconfirmed_rows_are_counted_apart(settings, relay):
    # The refused row stays out of the second drain, however slow the machine: with the
    # default backoff (1 s) it would be due again, and counted as unconfirmed too.
    settings.RELAY_RETRY_BACKOFF = 60
    with transaction.atomic():
        poison = dispatch("maintenance.purge", {})
    PlatformOutboxMessage.objects.filter(run_id=poison).update(
        envelope={"run_id": str(poison), "task": "x", "destination": "nowhere"}
    )
    refused = sample("hubdommed_relay_messages_refused_total", table=PLATFORM)
    relay.drain()
    assert sample("hubdommed_relay_messages_refused_total", table=PLATFORM) - refused == 1

    with transaction.atomic():
        dispatch("maintenance.purge", {"n": 1})
    unconfirmed = sample("hubdommed_relay_messages_unconfirmed_total", table=PLATFORM)
    settings.RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:1/%2F"
    unreachable = OutboxRelay()
    unreachable.drain()
    unreachable.close()
    assert sample("hubdommed_relay_messages_unconfirmed_total", table=PLATFORM) - unconfirmed == 1


def test_a_line_per_batch_and_a_debug_line_per_row_with_its_ids(relay, caplog):
    caplog.handler.addFilter(ContextFilter())
    tenant = TenantFactory()
    with transaction.atomic():
        platform_run = dispatch("maintenance.purge", {"n": 1})
        publish(
            "JobCreated",
            {"automation_id": 5, "job_id": 7},
            tenant=tenant,
            aggregate=("Job", 7),
        )

    with caplog.at_level(logging.DEBUG, logger="hubdommed.relay"):
        relay.drain()

    batches = [r for r in caplog.records if r.getMessage() == "relayed batch"]
    assert {(r.table, r.sent) for r in batches} >= {(PLATFORM, 1)}
    assert all(r.levelno == logging.INFO for r in batches)
    rows = [r for r in caplog.records if r.getMessage() == "relayed message"]
    platform_row = PlatformOutboxMessage.objects.get(run_id=platform_run)
    (platform_line,) = [r for r in rows if r.run_id == str(platform_run)]
    assert platform_line.correlation_id == platform_row.envelope["correlation_id"]
    assert platform_line.task == "maintenance.purge" and platform_line.tenant_id is None
    tenant_lines = [r for r in rows if r.table == TENANT]
    assert tenant_lines and {r.tenant_id for r in tenant_lines} == {str(tenant.pk)}
    assert all(r.levelno == logging.DEBUG and r.correlation_id for r in tenant_lines)


def test_wakes_are_counted_by_source(settings, redis_conn):
    command = Command()
    signal = sample("hubdommed_relay_wakes_total", source="signal")
    sweep = sample("hubdommed_relay_wakes_total", source="sweep")

    try:
        command.wait_for_signal(timeout=0.05)
        redis_conn.rpush(settings.OUTBOX_WAKE_KEY, "1")
        command.wait_for_signal(timeout=5)
    finally:
        command.redis.close()

    assert sample("hubdommed_relay_wakes_total", source="sweep") - sweep == 1
    assert sample("hubdommed_relay_wakes_total", source="signal") - signal == 1
