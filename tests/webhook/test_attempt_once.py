"""Two holders of one run (a lease taken over from a worker that stalled, say) never make
two attempts of one delivery at once, and never wait on each other: the second finds the
first's attempt in flight and leaves the delivery to it.

Before, the second took the delivery's row and then waited for the first's attempt lock,
while the first, once answered, waited for that row to record its outcome: a deadlock,
one of the two aborted, the delivery's success possibly unrecorded and sent again.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from time import monotonic

import pytest
from django.db import transaction

from tests.locks import Racer, until_another_waits
from tests.polling import wait_until
from tests.webhook.conftest import Reply
from tests.webhook.test_delivery import complete_a_job
from webhook import delivery as engine
from webhook.models import WebhookDelivery, WebhookEndpoint
from webhook.services import endpoint_disable

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def patient_receiver(receiver, webhook_settings):
    """The first request waits until the test lets it answer; every later one at once."""
    webhook_settings.WEBHOOK_READ_TIMEOUT = 60.0
    webhook_settings.WEBHOOK_TIMEOUT = 60.0
    webhook_settings.WEBHOOK_SLOW_SECONDS = 60.0
    receiver.script(Reply(delay=60))
    return receiver


def attempt_lock_holders(delivery_id: int) -> int:
    """Sessions holding the attempt lock of ``delivery_id`` now."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
            "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "AND objid = %s AND objsubid = 2 AND granted",
            [engine.ATTEMPT_LOCK_NAMESPACE, delivery_id % 2**31],
        )
        return cursor.fetchone()[0]


def one_run(deliveries: list[WebhookDelivery]):
    """The deliveries scheduled on one run, as an endpoint's hand-on leaves them."""
    with transaction.atomic():
        run_id = engine.schedule_deliveries(deliveries, delay=None)
        WebhookDelivery.objects.bulk_update(deliveries, ["scheduled_run_id", "next_attempt_at"])
    return run_id


def deliveries_on_one_run(make_endpoint, receiver, tenant, *, count: int, answers_fast: bool):
    """``count`` deliveries to an endpoint of ``receiver``, on one run: (them, the run)."""
    endpoint = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=answers_fast)
    for _ in range(count):
        complete_a_job(tenant)
    deliveries = list(WebhookDelivery.objects.order_by("id"))
    return deliveries, one_run(deliveries)


@contextlib.contextmanager
def first_holder(receiver, attempt) -> Iterator[Racer]:
    """The first holder's ``attempt`` in a thread of its own, its request held at the
    receiver for the block's time and answered at its end (join it after)."""
    first = Racer("first", attempt).start()
    try:
        wait_until(receiver.requests, message="the first holder's request")
        yield first
    finally:
        receiver.release.set()


def one_delivery(make_endpoint, receiver, tenant, *, answers_fast: bool | None = None):
    """An endpoint of ``receiver`` (answering fast, or not, when said) and one delivery."""
    endpoint = make_endpoint(receiver.url)
    if answers_fast is not None:
        WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=answers_fast)
    complete_a_job(tenant)
    return endpoint, WebhookDelivery.objects.get()


@pytest.mark.parametrize("answers_fast", [False, True], ids=["whole-way", "fast-way"])
def test_the_second_holder_of_a_run_leaves_a_delivery_in_flight_to_the_first(
    patient_receiver, make_endpoint, tenant, answers_fast
):
    _, delivery = one_delivery(make_endpoint, patient_receiver, tenant, answers_fast=answers_fast)

    def attempt():
        return engine.delivery_attempt(delivery_id=delivery.pk, run_id=delivery.scheduled_run_id)

    with first_holder(patient_receiver, attempt) as first:
        second = Racer("second", attempt).start()
        waited = until_another_waits(done=second.finished)
    first_outcome = first.join()
    second_outcome = second.join()

    assert not waited, "the second holder waited on the first one's attempt"
    assert second_outcome is engine.Outcome.STALE
    assert first_outcome is engine.Outcome.DELIVERED
    assert len(patient_receiver.requests()) == 1
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert delivery.attempts == 1
    assert delivery.attempt_started_at is None
    assert attempt_lock_holders(delivery.pk) == 0


def test_a_batch_of_the_second_holder_goes_round_the_delivery_in_flight(
    patient_receiver, make_endpoint, tenant
):
    deliveries, run_id = deliveries_on_one_run(
        make_endpoint, patient_receiver, tenant, count=4, answers_fast=True
    )
    head, in_flight, *rest = deliveries

    # The first holder is in the middle of the run: its second delivery's attempt awaits
    # its answer.
    def attempt():
        return engine.delivery_attempt(delivery_id=in_flight.pk, run_id=run_id)

    with first_holder(patient_receiver, attempt) as first:
        # The second holder takes the run from its head: one delivery, then a batch of the
        # rest, the one in flight among them.
        second = Racer(
            "second", lambda: engine.deliveries_run(delivery_id=head.pk, run_id=run_id)
        ).start()
        waited = until_another_waits(done=second.finished)
    first_outcome = first.join()
    second_outcomes = second.join()

    assert not waited, "the second holder waited on the first one's attempt"
    assert first_outcome is engine.Outcome.DELIVERED
    assert second_outcomes.count(engine.Outcome.DELIVERED) == 1 + len(rest)
    sent = [request.headers["webhook-id"] for request in patient_receiver.requests()]
    assert sorted(sent) == sorted(d.message_id for d in deliveries), "each delivery once"
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}
    assert WebhookDelivery.objects.filter(attempt_started_at__isnull=False).count() == 0
    for delivery in deliveries:
        assert attempt_lock_holders(delivery.pk) == 0


def test_the_second_holder_does_not_park_a_delivery_in_flight(
    patient_receiver, make_endpoint, tenant, manager
):
    # The endpoint disabled while the first holder waits for its answer: the second holder
    # would park the delivery (held for the enable), and the first's success would then
    # find it moved and go unrecorded, to be sent again on the enable.
    endpoint, delivery = one_delivery(make_endpoint, patient_receiver, tenant)

    def attempt():
        return engine.delivery_attempt(delivery_id=delivery.pk, run_id=delivery.scheduled_run_id)

    with first_holder(patient_receiver, attempt) as first:
        endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
        second_outcome = attempt()
    first_outcome = first.join()

    assert second_outcome is engine.Outcome.STALE
    assert first_outcome is engine.Outcome.DELIVERED
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert len(patient_receiver.requests()) == 1


@pytest.mark.parametrize("answers_fast", [True, False], ids=["fast-way", "whole-way"])
def test_the_second_holder_stopping_short_does_not_move_a_delivery_in_flight(
    patient_receiver, make_endpoint, tenant, answers_fast
):
    # The second holder's time is spent at once (a deadline past): it hands the run's rest
    # on, which would reschedule the delivery the first has in flight, and the first's
    # success would then find it moved, unrecorded, to be sent again.
    deliveries, run_id = deliveries_on_one_run(
        make_endpoint, patient_receiver, tenant, count=2, answers_fast=answers_fast
    )
    in_flight, other = deliveries

    def attempt():
        return engine.delivery_attempt(delivery_id=in_flight.pk, run_id=run_id)

    with first_holder(patient_receiver, attempt) as first:
        engine.deliveries_run(delivery_id=in_flight.pk, run_id=run_id, deadline=monotonic() - 1)
        assert WebhookDelivery.objects.get(pk=in_flight.pk).scheduled_run_id == run_id
    first_outcome = first.join()

    assert first_outcome is engine.Outcome.DELIVERED
    in_flight.refresh_from_db()
    assert in_flight.status == "delivered"
    other.refresh_from_db()
    assert other.status == "pending" and other.scheduled_run_id not in (None, run_id)
    assert [r.headers["webhook-id"] for r in patient_receiver.requests()] == [in_flight.message_id]


@pytest.mark.parametrize("answers_fast", [True, False], ids=["fast-way", "whole-way"])
def test_the_same_lock_key_held_in_another_database_is_no_attempt_in_flight(
    receiver, make_endpoint, tenant, answers_fast
):
    # Advisory locks are each database's own: a hub database beside this one on the same
    # server (a staging one, a test run's) holding the same key holds nothing of ours.
    import psycopg
    from django.db import connection as ours

    endpoint = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=answers_fast)
    complete_a_job(tenant)
    delivery = WebhookDelivery.objects.get()
    params = ours.settings_dict
    with psycopg.connect(
        dbname="postgres", host=params["HOST"], port=params["PORT"] or 5432, user=params["USER"]
    ) as elsewhere:
        elsewhere.execute(
            "SELECT pg_advisory_lock(%s, %s)",
            [engine.ATTEMPT_LOCK_NAMESPACE, delivery.pk % 2**31],
        )
        outcome = engine.delivery_attempt(delivery_id=delivery.pk, run_id=delivery.scheduled_run_id)

    assert outcome is engine.Outcome.DELIVERED
    assert len(receiver.requests()) == 1
