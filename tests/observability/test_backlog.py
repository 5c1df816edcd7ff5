"""The outbox backlog, measured at scrape time: rows not sent, age of the oldest due row."""

from __future__ import annotations

import contextlib
import logging
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from outbox.metrics import OutboxBacklogCollector
from outbox.models import OutboxMessage, PlatformOutboxMessage
from tests.ports import free_port

PENDING = "hubdommed_outbox_pending_messages"
OLDEST = "hubdommed_outbox_oldest_due_age_seconds"


def scrape(collector) -> dict[tuple[str, str], float]:
    return {
        (family.name, s.labels["table"]): s.value
        for family in collector.collect()
        for s in family.samples
    }


def outbox_row(model, *, due_in: float, sent: bool = False, **fields):
    now = timezone.now()
    return model.objects.create(
        run_id=uuid.uuid4(),
        queue="default",
        envelope={"task": "test.noop"},
        available_at=now + timedelta(seconds=due_in),
        sent_at=now if sent else None,
        **fields,
    )


@pytest.mark.django_db
def test_pending_rows_and_the_age_of_the_oldest_due_one_per_table(tenant):
    outbox_row(OutboxMessage, due_in=-30, tenant=tenant)  # due for 30 s
    outbox_row(OutboxMessage, due_in=-5, tenant=tenant)
    outbox_row(OutboxMessage, due_in=600, tenant=tenant)  # pending, not due yet
    outbox_row(OutboxMessage, due_in=-900, sent=True, tenant=tenant)  # sent: not backlog
    outbox_row(PlatformOutboxMessage, due_in=300)  # pending, not due

    values = scrape(OutboxBacklogCollector())

    assert values[(PENDING, "outbox_messages")] == 3
    assert 30 <= values[(OLDEST, "outbox_messages")] < 120
    assert values[(PENDING, "platform_outbox_messages")] == 1
    # Nothing due: no age, rather than the age of a row that is not late.
    assert values[(OLDEST, "platform_outbox_messages")] == 0


@pytest.mark.django_db
def test_an_empty_outbox_reports_zeros_not_nothing():
    values = scrape(OutboxBacklogCollector())

    assert values == {
        (PENDING, "outbox_messages"): 0,
        (PENDING, "platform_outbox_messages"): 0,
        (OLDEST, "outbox_messages"): 0,
        (OLDEST, "platform_outbox_messages"): 0,
    }


@contextlib.contextmanager
def database_unreachable():
    """A stopped PostgreSQL as a client sees it: the connection gone, a new one refused."""
    closed_port = free_port()
    saved = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = closed_port
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = saved


@pytest.mark.django_db(transaction=True)
def test_a_scrape_while_the_database_is_down_leaves_the_backlog_out_and_says_so_once(caplog):
    collector = OutboxBacklogCollector()
    caplog.set_level(logging.INFO, logger="hubdommed.metrics")

    with database_unreachable():
        first, second = scrape(collector), scrape(collector)

    assert first == {} and second == {}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert "database unavailable" in warnings[0].getMessage()

    # Back: measured again, and the return is said once.
    assert scrape(collector)[(PENDING, "outbox_messages")] == 0
    assert "measured again" in caplog.text


@pytest.mark.django_db(transaction=True)
def test_a_scrape_of_the_api_while_the_database_is_down_still_answers():
    from django.test import Client

    with database_unreachable():
        response = Client(raise_request_exception=False).get("/metrics")

    assert response.status_code == 200
    body = response.content.decode()
    assert "hubdommed_http_requests_total" in body
    assert PENDING not in body
