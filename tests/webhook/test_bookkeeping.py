"""What one attempt costs the database: no more statements than its guarantees need.

A delivery to a receiver that answers fast begins in one statement (the delivery's row,
the slow-receiver guard, the attempt's liveness lock) and its success is recorded in one
(the attempt and the delivered delivery, durable before the run is settled). It was 13
statements (two transactions) before. A delivery deferred behind a live attempt of its
endpoint costs no new run: it is parked, and that attempt's outcome takes it up.
"""

from __future__ import annotations

import uuid

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from outbox.models import OutboxMessage
from tests.webhook.conftest import due_deliver_runs, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.delivery import Outcome, _hold_attempt, _let_go_attempt, delivery_attempt
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def attempt_statements(row) -> tuple[Outcome, list[str]]:
    """The attempt of an outbox row's run, as the task makes it, and its statements."""
    with CaptureQueriesContext(connection) as captured:
        outcome = delivery_attempt(
            delivery_id=row.envelope["payload"]["delivery_id"],
            run_id=uuid.UUID(row.envelope["run_id"]),
        )
    return outcome, [query["sql"] for query in captured.captured_queries]


def test_a_delivery_to_a_fast_receiver_costs_two_statements(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()  # the first attempt finds the receiver fast
    complete_a_job(tenant)
    (row,) = due_deliver_runs()

    outcome, statements = attempt_statements(row)

    assert outcome is Outcome.DELIVERED
    assert len(statements) == 2, statements
    delivery = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id").last()
    assert delivery.status == "delivered" and delivery.attempts == 1
    assert delivery.scheduled_run_id is None and delivery.attempt_started_at is None
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.number == 1 and attempt.status_code == 200 and attempt.response_excerpt == "ok"


def test_a_success_with_parked_deliveries_takes_them_up(receiver, make_endpoint, tenant):
    # The one-statement record leaves an endpoint with parked deliveries to the whole way,
    # whose success takes them up.
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    complete_a_job(tenant)
    complete_a_job(tenant)
    probe, parked = WebhookDelivery.objects.filter(status="pending").order_by("id")
    parked.park()
    parked.save()
    (row,) = [
        row for row in due_deliver_runs() if row.envelope["payload"]["delivery_id"] == probe.pk
    ]

    outcome, statements = attempt_statements(row)

    assert outcome is Outcome.DELIVERED
    assert len(statements) > 2
    parked.refresh_from_db()
    assert parked.scheduled_run_id is not None  # taken up
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).answers_fast


def test_a_success_beside_a_failing_endpoint_is_decided_the_whole_way(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    complete_a_job(tenant)
    # Another delivery's failure was recorded while this one was on its way.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since="2026-01-01T00:00Z")
    (row,) = due_deliver_runs()

    outcome, _ = attempt_statements(row)

    assert outcome is Outcome.DELIVERED
    # The success ends the endpoint's failing, as the whole way decides.
    assert WebhookEndpoint.objects.get(pk=endpoint.pk).failing_since is None


def deliver_rows() -> int:
    return OutboxMessage.objects.filter(envelope__task="webhook.deliver").count()


def test_a_deferral_behind_a_live_attempt_parks_without_a_new_run(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)  # new: one attempt at a time
    complete_a_job(tenant)
    complete_a_job(tenant)
    first, later = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id")
    later_run = later.scheduled_run_id
    # The first delivery's attempt is in flight on a live session.
    first.attempt_started_at = timezone.now()
    first.save(update_fields=["attempt_started_at"])
    _hold_attempt(first.pk)
    rows = deliver_rows()
    try:
        outcome = delivery_attempt(delivery_id=later.pk, run_id=later_run)
        # The same run sent again (a duplicate) is stale: still no new run.
        again = delivery_attempt(delivery_id=later.pk, run_id=later_run)
    finally:
        _let_go_attempt(first.pk)

    assert (outcome, again) == (Outcome.DEFERRED, Outcome.STALE)
    assert deliver_rows() == rows
    later.refresh_from_db()
    assert later.is_parked and later.attempts == 0

    # The attempt in flight ends delivered, and takes the parked one up: one new run.
    assert delivery_attempt(delivery_id=first.pk, run_id=first.scheduled_run_id) == (
        Outcome.DELIVERED
    )
    later.refresh_from_db()
    assert later.scheduled_run_id is not None and deliver_rows() == rows + 1
    assert delivery_attempt(delivery_id=later.pk, run_id=later.scheduled_run_id) == (
        Outcome.DELIVERED
    )
