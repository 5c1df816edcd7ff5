"""A slow or failing receiver holds one worker slot at most; proved with real threads over
the real database, and end to end through the relay, RabbitMQ and the background worker."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection
from django.utils import timezone

from tests.broker_queues import delete_queues
from tests.polling import wait_until
from tests.webhook.conftest import Reply, due_deliver_runs
from tests.webhook.test_delivery import complete_a_job
from tests.worker.conftest import BackgroundRelay, WorkerThread
from webhook.delivery import Outcome, delivery_attempt
from webhook.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)


def attempt_in_thread(delivery: WebhookDelivery, results: dict, start: threading.Barrier):
    def run():
        try:
            start.wait(5)
            results[delivery.pk] = delivery_attempt(
                delivery_id=delivery.pk, run_id=delivery.scheduled_run_id
            )
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def two_deliveries(make_endpoint, tenant, url) -> tuple[WebhookEndpoint, list[WebhookDelivery]]:
    endpoint = make_endpoint(url)
    complete_a_job(tenant)
    complete_a_job(tenant)
    deliveries = list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id"))
    assert len(deliveries) == 2
    return endpoint, deliveries


def test_a_failing_receiver_gets_one_attempt_at_a_time(receiver, make_endpoint, tenant):
    endpoint, deliveries = two_deliveries(make_endpoint, tenant, receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=timezone.now())
    # Retries both (a failing endpoint's new deliveries are parked instead).
    WebhookDelivery.objects.filter(endpoint=endpoint).update(attempts=1)
    receiver.default = Reply(delay=5.0)  # never answers within the read timeout
    results: dict[int, Outcome] = {}
    start = threading.Barrier(2)

    threads = [attempt_in_thread(d, results, start) for d in deliveries]
    for thread in threads:
        thread.join(10)

    # One attempted (and failed); the other waited its turn, not counted as an attempt:
    # parked behind the live attempt (which then became the endpoint's probe), or, when it
    # found the token busy, given a new run (then the failed one parked behind it).
    attempted = next(d for d in deliveries if results[d.pk] != Outcome.DEFERRED)
    assert results[attempted.pk] in (Outcome.RETRYING, Outcome.PARKED)
    assert len(receiver.requests()) == 1
    deferred = next(d for d in deliveries if d.pk != attempted.pk)
    assert results[deferred.pk] == Outcome.DEFERRED
    deferred.refresh_from_db()
    assert deferred.attempts == 1  # as before: the deferral is no attempt
    assert deferred.status == WebhookDelivery.Status.PENDING
    # Exactly one probe on its way, the other parked behind it.
    pending = WebhookDelivery.objects.filter(endpoint=endpoint, status="pending")
    assert pending.filter(scheduled_run_id__isnull=False).count() == 1
    assert pending.filter(scheduled_run_id__isnull=True).count() == 1


def test_a_new_receiver_gets_one_attempt_at_a_time(receiver, make_endpoint, tenant):
    _endpoint, deliveries = two_deliveries(make_endpoint, tenant, receiver.url)
    receiver.default = Reply(delay=5.0)  # it has not answered yet, fast or at all
    results: dict[int, Outcome] = {}
    start = threading.Barrier(2)
    threads = [attempt_in_thread(d, results, start) for d in deliveries]
    for thread in threads:
        thread.join(10)
    assert sorted(results.values()) == sorted([Outcome.DEFERRED, Outcome.RETRYING])
    assert len(receiver.requests()) == 1


def test_a_receiver_that_answered_fast_takes_attempts_at_once(receiver, make_endpoint, tenant):
    endpoint, deliveries = two_deliveries(make_endpoint, tenant, receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=True)
    inside = threading.Barrier(2, timeout=5)
    # Each request waits until both are inside the receiver: only parallel attempts pass.
    receiver.default = Reply(delay=0)
    original = receiver.server.RequestHandlerClass.do_POST

    def do_post(handler):
        inside.wait()
        original(handler)

    receiver.server.RequestHandlerClass.do_POST = do_post
    results: dict[int, Outcome] = {}
    start = threading.Barrier(2)
    threads = [attempt_in_thread(d, results, start) for d in deliveries]
    for thread in threads:
        thread.join(10)
    assert list(results.values()) == [Outcome.DELIVERED, Outcome.DELIVERED]


def test_a_receiver_slower_than_the_slow_mark_gets_one_attempt_at_a_time(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_SLOW_SECONDS = 0.1
    endpoint, (first, second) = two_deliveries(make_endpoint, tenant, receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=True)
    receiver.default = Reply(delay=5.0)
    results: dict[int, Outcome] = {}
    thread = attempt_in_thread(first, results, threading.Barrier(1))
    wait_until(lambda: receiver.requests())
    # Past the slow mark, the first attempt still in flight:
    wait_until(
        lambda: (
            (
                timezone.now() - WebhookDelivery.objects.get(pk=first.pk).attempt_started_at
            ).total_seconds()
            > 0.15
        )
    )
    assert delivery_attempt(delivery_id=second.pk, run_id=second.scheduled_run_id) == (
        Outcome.DEFERRED
    )
    thread.join(10)
    assert results[first.pk] == Outcome.RETRYING
    assert len(receiver.requests()) == 1


@pytest.fixture
def broker_names(settings, exchange_name):
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}wh-{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    settings.BROKER = "rabbitmq"
    settings.RELAY_SWEEP_INTERVAL = 0.1
    yield settings
    delete_queues(settings.RABBITMQ_URL)


@pytest.mark.slow
def test_end_to_end_through_the_relay_and_the_worker(broker_names, receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=500), Reply(delay=5.0))  # then 200
    relay = BackgroundRelay().start()
    worker = WorkerThread(concurrency=2, queues=("default", "critical")).start()
    try:
        complete_a_job(tenant)
        delivered = wait_until(
            lambda: WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").first(),
            timeout=30,
        )
    finally:
        worker.stop()
        relay.stop()
    requests = receiver.requests()
    assert len(requests) == 3  # a 500, a timeout, then the 200
    assert {r.headers["webhook-id"] for r in requests} == {delivered.message_id}
    assert delivered.attempts == 3
    assert due_deliver_runs() == []
    assert worker.error is None and relay.error is None


def test_an_attempt_never_queues_behind_another_starting_for_the_same_receiver(
    receiver, make_endpoint, tenant
):
    endpoint, (delivery, _other) = two_deliveries(make_endpoint, tenant, receiver.url)
    holding, release = threading.Event(), threading.Event()

    def hold_the_endpoint():
        # What a delivery starting its attempt does, for as long as the test says.
        from django.db import transaction

        try:
            with transaction.atomic():
                WebhookEndpoint.objects.select_for_update(no_key=True).get(pk=endpoint.pk)
                holding.set()
                release.wait(10)
        finally:
            connection.close()

    holder = threading.Thread(target=hold_the_endpoint)
    holder.start()
    try:
        assert holding.wait(5)
        outcome = delivery_attempt(delivery_id=delivery.pk, run_id=delivery.scheduled_run_id)
    finally:
        release.set()
        holder.join(10)
    assert outcome == Outcome.DEFERRED
    assert receiver.requests() == []
