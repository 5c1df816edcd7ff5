"""Outbox rows with no way forward: the monitor's check of each outbox table brings forward
a row due past the longest delay the hub makes, and reports (once) a row the broker keeps
refusing, which the relay keeps trying and sends once the broker takes it again."""

from __future__ import annotations

# The worker runtime's fixtures (per-test broker names, the broker) are imported from
# tests/worker/conftest.py; tests naming them as arguments "redefine" them for ruff.
# ruff: noqa: F811
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import transaction
from django.utils import timezone
from prometheus_client import REGISTRY

from common.ways_forward import stranded_checks
from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.services import OutboxError, dispatch
from outbox.stranded import REFUSALS_REPORTED
from relay.engine import OutboxRelay
from tests.monitor.conftest import monitor  # noqa: F401 (fixture)
from tests.observability.conftest import sample
from tests.outbox.support import delete_queue
from tests.worker.conftest import (  # noqa: F401 (fixtures)
    broker,
    dispatch_work,
    test_catalog,
    worker_settings,
)

pytestmark = pytest.mark.django_db(transaction=True)

TABLE = "platform_outbox_messages"


def check() -> list:
    return stranded_checks()[TABLE]()


def unrepaired() -> float | None:
    return REGISTRY.get_sample_value("hubdommed_stranded_rows_unrepaired", {"machine": TABLE})


def row_of(run_id: str) -> PlatformOutboxMessage:
    return PlatformOutboxMessage.objects.get(run_id=run_id)


@pytest.fixture
def relay(broker):
    """The relay's engine, one pass at a time, in the test's thread."""
    engine = OutboxRelay()
    engine.transport.setup_topology()
    yield engine
    engine.close()


def refused_again_and_again(relay, run_id: str, times: int) -> None:
    """The relay tries the row ``times`` times and the broker refuses it each time (its
    backoff skipped between tries: the time it would take)."""
    before = row_of(run_id).attempts
    for _ in range(times):
        PlatformOutboxMessage.objects.filter(run_id=run_id).update(available_at=timezone.now())
        relay.relay_one_batch()
    row = row_of(run_id)
    assert row.sent_at is None and row.attempts == before + times
    assert row.available_at > timezone.now()  # backed off


def test_dispatch_refuses_a_delay_past_the_longest_the_outbox_takes(settings):
    settings.OUTBOX_MAX_DELAY_SECONDS = 3600
    with pytest.raises(OutboxError, match="OUTBOX_MAX_DELAY_SECONDS"), transaction.atomic():
        dispatch("test.work", {}, delay=3601)
    assert not PlatformOutboxMessage.objects.exists() and not TaskRun.objects.exists()


def test_a_row_due_past_the_longest_delay_is_brought_forward_and_sent(relay, monitor):
    run_id = dispatch_work()
    # A clock gone wrong when it was written: due in a month.
    PlatformOutboxMessage.objects.filter(run_id=run_id).update(
        available_at=timezone.now() + timedelta(days=30)
    )
    before = sample("hubdommed_stranded_rows_total", machine=TABLE)

    counts = monitor.run_cycle()

    assert counts.stranded.repaired[TABLE] == 1
    assert sample("hubdommed_stranded_rows_total", machine=TABLE) == before + 1
    assert row_of(run_id).available_at <= timezone.now()
    relay.relay_one_batch()
    assert row_of(run_id).sent_at is not None
    assert check() == []


def test_a_row_the_broker_keeps_refusing_is_reported_once_and_sent_once_the_broker_takes_it(
    relay, monitor, caplog
):
    caplog.set_level(logging.WARNING, logger="hubdommed.monitor")
    run_id = dispatch_work()
    delete_queue()

    refused_again_and_again(relay, run_id, REFUSALS_REPORTED - 1)
    assert check() == []  # a few refusals: the relay's backoff is its way forward
    refused_again_and_again(relay, run_id, 1)
    # The broker's reason, on the run, for an operator.
    assert TaskRun.objects.get(run_id=run_id).last_error.startswith("Refused by the broker: ")

    (found,) = check()
    assert not found.repaired and "keeps refusing" in found.problem
    assert f"{REFUSALS_REPORTED} attempts" in found.action
    assert "last refusal: Refused by the broker" in found.action
    for _ in range(3):
        counts = monitor.run_cycle()
        assert counts.stranded.unrepaired[TABLE] == 1
    assert unrepaired() == 1
    logged = [r for r in caplog.records if r.getMessage().startswith(f"stranded {TABLE}")]
    assert len(logged) == 1 and str(run_id) in logged[0].row
    row = row_of(run_id)
    assert row.sent_at is None  # kept: the only copy of what was committed

    # The operator declares the queue again: the relay's next try sends it.
    call_command("setup_broker", stdout=StringIO())
    PlatformOutboxMessage.objects.filter(run_id=run_id).update(available_at=timezone.now())
    relay.relay_one_batch()
    assert row_of(run_id).sent_at is not None
    monitor.run_cycle()
    assert unrepaired() == 0


def test_rows_on_their_way_are_not_reported(relay, settings):
    settings.OUTBOX_MAX_DELAY_SECONDS = 7 * 24 * 3600
    with transaction.atomic():
        delayed = dispatch("test.work", {}, delay=6 * 24 * 3600)  # within the bound
    backing_off = dispatch_work()
    delete_queue()
    refused_again_and_again(relay, backing_off, 3)
    # Tried a thousand times while the broker was away, and due: the relay's.
    waiting = dispatch_work()
    PlatformOutboxMessage.objects.filter(run_id=waiting).update(attempts=1000)

    assert check() == []

    assert row_of(delayed).available_at > timezone.now() + timedelta(days=5)
