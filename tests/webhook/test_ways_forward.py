"""Every pending delivery keeps a way forward: after a final failure, across a success that
commits first, when its attempt raises, and after an outage (its backlog comes back fast)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from tests.polling import wait_until
from tests.webhook.conftest import Reply, due_deliver_runs, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from tests.webhook.test_isolation import broker_names  # noqa: F401 (a fixture)
from tests.worker.conftest import BackgroundRelay, WorkerThread
from webhook.delivery import Outcome, delivery_attempt
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def run_until_quiet(rounds: int = 20) -> None:
    """Run the due attempts until none is left (within ``rounds``, or the test fails)."""
    for _ in range(rounds):
        if run_due_attempts() == 0:
            return
    raise AssertionError(f"attempts still scheduled after {rounds} rounds")


def statuses(endpoint) -> list[str]:
    return list(
        WebhookDelivery.objects.filter(endpoint=endpoint)
        .order_by("id")
        .values_list("status", flat=True)
    )


@pytest.mark.django_db
def test_an_endpoint_that_answered_400_once_still_gets_its_later_events(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=400))
    complete_a_job(tenant)
    run_due_attempts()
    assert statuses(endpoint) == ["failed"]

    for _ in range(3):
        complete_a_job(tenant)
    run_until_quiet()

    assert statuses(endpoint) == ["failed", "delivered", "delivered", "delivered"]
    assert len(receiver.requests()) == 4


@pytest.mark.django_db
def test_an_endpoint_whose_address_was_refused_once_gets_its_later_events(
    receiver, make_endpoint, tenant, settings
):
    endpoint = make_endpoint(receiver.url)
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False  # plain http to loopback: refused
    complete_a_job(tenant)
    run_due_attempts()
    assert statuses(endpoint) == ["failed"]

    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    complete_a_job(tenant)
    complete_a_job(tenant)
    run_until_quiet()

    assert statuses(endpoint) == ["failed", "delivered", "delivered"]


@pytest.mark.django_db
def test_a_disabled_endpoints_deliveries_are_held_and_resume_when_it_is_enabled(
    receiver, make_endpoint, tenant, manager
):
    from webhook.services import endpoint_disable, endpoint_enable

    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()  # the endpoint fails: the next delivery is parked
    complete_a_job(tenant)
    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    run_until_quiet()  # the retry's run comes: it is held too, not failed
    assert statuses(endpoint) == ["pending", "pending"]
    assert len(receiver.requests()) == 1

    endpoint_enable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    run_until_quiet()

    assert statuses(endpoint) == ["delivered", "delivered"]


@pytest.mark.django_db
def test_an_attempt_that_raises_is_recorded_and_retried(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    # A secret that cannot sign (not base64): building the request raises, nothing is sent.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(secret="whsec_caf\u00e9")
    complete_a_job(tenant)
    assert len(due_deliver_runs()) == 1

    run_due_attempts()  # does not raise: the task is not dead-lettered

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.attempts == 1
    assert delivery.scheduled_run_id is not None
    assert delivery.next_attempt_at is not None
    (attempt,) = WebhookAttempt.objects.filter(delivery=delivery)
    assert attempt.status_code is None
    assert attempt.error.startswith("ValueError: ")
    assert delivery.last_error == attempt.error
    assert receiver.requests() == []


def _wait_for_lock_wait(timeout: float = 5.0) -> bool:
    """Whether another backend waits on a row lock now (polled, within ``timeout``)."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            if cursor.fetchone()[0]:
                return True
            time.sleep(0.02)
    return False


@pytest.mark.django_db(transaction=True)
def test_a_delivery_committed_after_the_success_that_clears_its_endpoint_is_not_stranded(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_READ_TIMEOUT = 10.0
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503), Reply(status=200, delay=10.0))
    complete_a_job(tenant)
    run_due_attempts()  # fails: the endpoint is failing, its one delivery probes it
    (probe,) = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert probe.scheduled_run_id is not None
    outcome = {}

    def succeed():
        try:
            outcome["probe"] = delivery_attempt(delivery_id=probe.pk, run_id=probe.scheduled_run_id)
        finally:
            connection.close()

    thread = threading.Thread(target=succeed)
    thread.start()
    try:
        # The probe's request is at the receiver, which holds its 200 for now.
        wait_until(lambda: len(receiver.requests()) == 2, timeout=5)
        with transaction.atomic():
            complete_a_job(tenant)  # the event's transaction: its endpoint is failing
            receiver.release.set()  # the 200 goes back: the success is recorded now
            # It waits for this transaction (the endpoint's row lock), or (without that
            # lock) commits before it: either way this one commits after it began.
            if not _wait_for_lock_wait(timeout=3):
                thread.join(5)
    finally:
        thread.join(10)
    assert outcome["probe"] is Outcome.DELIVERED

    late = WebhookDelivery.objects.filter(endpoint=endpoint).exclude(pk=probe.pk).get()
    # Its way forward: a run of its own, now that its endpoint answers.
    assert late.status == "pending" and late.scheduled_run_id is not None
    run_until_quiet()
    assert statuses(endpoint) == ["delivered", "delivered"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_backlog_of_100_parked_deliveries_is_drained_within_seconds_of_the_return(
    broker_names,  # noqa: F811
    receiver,
    make_endpoint,
    tenant,
    settings,
):
    # The production schedule: the defect was parked deliveries waiting for its 2 minutes.
    settings.WEBHOOK_RETRY_DELAYS = [5.0, 30.0, 120.0, 600.0]
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()  # the endpoint fails; its delivery retries, due in 5 s
    for _ in range(100):
        complete_a_job(tenant)
    assert WebhookDelivery.objects.filter(endpoint=endpoint, scheduled_run_id=None).count() == 100
    # It has been failing for a minute, and its probe came back 30 s later already.
    a_minute_ago = timezone.now() - timedelta(seconds=60)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(failing_since=a_minute_ago)
    WebhookDelivery.objects.filter(endpoint=endpoint).update(created_at=a_minute_ago)
    receiver.script(Reply(status=503))
    run_due_attempts()  # the receiver's last failure: its probe is scheduled again

    relay = BackgroundRelay().start()
    worker = WorkerThread(concurrency=4, queues=("default", "critical")).start()
    try:
        back = time.monotonic()  # the receiver answers 200 from now on
        wait_until(
            lambda: (
                WebhookDelivery.objects.filter(endpoint=endpoint, status="delivered").count() == 101
            ),
            timeout=10,
            message=lambda: f"delivered: {statuses(endpoint).count('delivered')} of 101",
        )
        drained_in = time.monotonic() - back
    finally:
        worker.stop()
        relay.stop()
    assert drained_in < 10
    assert worker.error is None and relay.error is None


@pytest.mark.django_db
def test_the_admin_tells_a_parked_or_held_delivery_from_one_retrying(
    client, platform_admin, receiver, make_endpoint, tenant, manager
):
    from webhook.services import endpoint_disable

    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()  # retrying: the endpoint's probe
    complete_a_job(tenant)  # parked behind it
    client.force_login(platform_admin)

    page = client.get("/admin/webhook/webhookdelivery/").content.decode()
    assert "scheduled: attempt 2 due" in page
    assert "parked: waits for its endpoint&#x27;s probe to succeed" in page

    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    page = client.get("/admin/webhook/webhookdelivery/").content.decode()
    assert page.count("held: its endpoint is disabled") == 1
