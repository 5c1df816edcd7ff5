"""Webhook deliveries to a real HTTP server on loopback: signed, retried, final, recorded."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import timedelta

import pytest
import time_machine
from django.db import connection, transaction
from django.utils import timezone
from standardwebhooks import Webhook

from job.services import job_complete, job_fail
from outbox.models import Event
from outbox.services import publish
from tests.factories import RunningJobFactory, TenantFactory, WorkerFactory
from tests.webhook.conftest import Reply, due_deliver_runs, run_attempt, run_due_attempts
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhook.recording import deliveries_wanted

pytestmark = pytest.mark.django_db


def independent_signature(secret: str, message_id: str, timestamp: str, body: bytes) -> str:
    """The Standard Webhooks signature, written from the spec, not from our code."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    to_sign = message_id.encode() + b"." + timestamp.encode() + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, to_sign, hashlib.sha256).digest()).decode()


def complete_a_job(tenant, result=None):
    worker = WorkerFactory()
    job = RunningJobFactory(tenant=tenant, automation=worker.automation)
    job_complete(
        worker=worker, job_id=job.pk, claim_token=job.claim_token, result=result or {"rows": 3}
    )
    return job


def test_a_completed_job_reaches_a_real_server_signed_with_the_secret(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    job = complete_a_job(tenant, {"rows": 3})

    assert run_due_attempts() == 1

    (request,) = receiver.requests()
    headers = request.headers
    assert request.path == "/hooks"
    assert headers["content-type"] == "application/json"
    assert headers["webhook-signature"] == independent_signature(
        endpoint.secret, headers["webhook-id"], headers["webhook-timestamp"], request.body
    )
    assert abs(int(headers["webhook-timestamp"]) - timezone.now().timestamp()) < 60
    # The reference implementation agrees, and hands back the body.
    payload = Webhook(endpoint.secret).verify(request.body, headers)
    event = Event.objects.get(type="JobCompleted", aggregate_id=str(job.pk))
    assert payload["type"] == "JobCompleted"
    assert payload["data"]["event_id"] == event.id
    assert payload["data"]["job_id"] == job.pk
    assert payload["data"]["job"]["id"] == job.pk
    assert payload["data"]["job"]["status"] == "succeeded"
    assert payload["data"]["job"]["result"] == {"rows": 3}

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert delivery.message_id == headers["webhook-id"]
    assert delivery.last_status_code == 200
    assert delivery.last_latency_ms is not None
    assert delivery.attempts == 1


def test_a_signature_made_with_another_secret_does_not_verify(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    (request,) = receiver.requests()
    other = make_endpoint(receiver.url)
    with pytest.raises(Exception, match="signature"):
        Webhook(other.secret).verify(request.body, request.headers)


def test_a_500_is_retried_later_with_the_same_webhook_id(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=500, body=b"boom"))
    complete_a_job(tenant)

    (first,) = due_deliver_runs()
    run_attempt(first)
    (retry,) = [row for row in due_deliver_runs() if row.pk != first.pk]
    # The retry is a new outbox run, due after the first delay of the schedule.
    assert retry.available_at - timezone.now() > timedelta(seconds=0.5)
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.last_status_code == 500
    assert delivery.next_attempt_at is not None

    run_attempt(retry)

    one, two = receiver.requests()
    assert one.headers["webhook-id"] == two.headers["webhook-id"] == delivery.message_id
    assert one.body == two.body
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert list(
        WebhookAttempt.objects.filter(delivery=delivery)
        .order_by("number")
        .values_list("number", "status_code")
    ) == [(1, 500), (2, 200)]
    assert WebhookAttempt.objects.get(delivery=delivery, number=1).response_excerpt == "boom"


def test_a_timeout_is_retried_with_the_same_webhook_id(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    # Longer than WEBHOOK_READ_TIMEOUT (0.5 s in these tests).
    receiver.script(Reply(delay=5.0))
    complete_a_job(tenant)

    assert run_due_attempts() == 1
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.last_status_code is None
    assert delivery.last_error.startswith("timeout")
    assert delivery.last_latency_ms < 2000  # the timeout cut it short, not the receiver

    assert run_due_attempts() == 1

    one, two = receiver.requests()
    assert one.headers["webhook-id"] == two.headers["webhook-id"]
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert delivery.attempts == 2


def test_a_connection_refused_is_retried(make_endpoint, tenant, receiver):
    receiver.server.server_close()  # nothing listens there any more
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.last_error.startswith("connection error")
    assert len(due_deliver_runs()) == 1


def test_a_429_is_retried_after_the_receivers_retry_after(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    receiver.script(Reply(status=429, headers={"Retry-After": "3"}))
    complete_a_job(tenant)
    run_due_attempts()
    (retry,) = due_deliver_runs()
    # Longer than the schedule's 1 s: the receiver asked for 3.
    assert retry.available_at - timezone.now() > timedelta(seconds=2.5)


@pytest.mark.parametrize("code", [400, 401, 404, 410, 422])
def test_another_4xx_is_final(receiver, make_endpoint, tenant, code):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=code))
    complete_a_job(tenant)
    run_due_attempts()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_status_code == code
    assert due_deliver_runs() == []


def test_retries_stop_when_the_schedule_is_spent(receiver, make_endpoint, tenant, settings):
    endpoint = make_endpoint(receiver.url)
    receiver.default = Reply(status=503)
    start = timezone.now()
    with time_machine.travel(start, tick=True) as traveller:
        complete_a_job(tenant)
        # Each attempt when its run is due (the schedule spans 7 s of the clock).
        for step in range(20):
            traveller.move_to(start + timedelta(seconds=4 * step))
            if not run_due_attempts():
                break
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    # The first attempt and one per delay of the schedule (the probe's pace is no shorter
    # than the schedule's 1, 2, 4 s here).
    assert delivery.attempts == len(settings.WEBHOOK_RETRY_DELAYS) + 1
    assert len({r.headers["webhook-id"] for r in receiver.requests()}) == 1


def test_the_default_schedule_grows_and_spans_about_a_day():
    import hubdommed.settings as shipped  # the module's value, under the tests' override

    delays = shipped.WEBHOOK_RETRY_DELAYS
    assert delays == sorted(delays)
    assert timedelta(hours=20) <= timedelta(seconds=sum(delays)) <= timedelta(hours=30)


def test_a_redirect_is_not_followed(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=307, headers={"Location": "/elsewhere"}))
    complete_a_job(tenant)
    run_due_attempts()
    assert [r.path for r in receiver.requests()] == ["/hooks"]
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert "not followed" in delivery.last_error


def test_an_allowed_redirect_is_checked_like_the_first_hop(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_MAX_REDIRECTS = 2
    endpoint = make_endpoint(receiver.url)
    receiver.script(
        Reply(status=308, headers={"Location": "/moved"}),
        Reply(status=307, headers={"Location": "http://169.254.169.254/latest/meta-data/"}),
    )
    complete_a_job(tenant)
    run_due_attempts()
    # Followed on the receiver itself, refused towards the metadata service.
    assert [r.path for r in receiver.requests()] == ["/hooks", "/moved"]
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error.startswith("refused")


def test_the_answer_is_read_only_up_to_the_bound(receiver, make_endpoint, tenant, settings):
    settings.WEBHOOK_MAX_RESPONSE_BYTES = 2048
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=200, body=b"x" * (20 * 1024 * 1024)))
    complete_a_job(tenant)
    run_due_attempts()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert len(attempt.response_excerpt) == 1024


def test_only_the_event_types_an_endpoint_wants_become_deliveries(receiver, make_endpoint, tenant):
    wants_failures = make_endpoint(receiver.url, event_types=["JobFailed"])
    wants_all = make_endpoint(receiver.url, event_types=["JobCompleted", "JobFailed"])
    complete_a_job(tenant)
    assert not WebhookDelivery.objects.filter(endpoint=wants_failures).exists()
    assert WebhookDelivery.objects.filter(endpoint=wants_all, event_type="JobCompleted").exists()

    worker = WorkerFactory()
    job = RunningJobFactory(tenant=tenant, automation=worker.automation)
    job_fail(worker=worker, job_id=job.pk, claim_token=job.claim_token, error="bad", exit_code=2)
    assert WebhookDelivery.objects.filter(endpoint=wants_failures, event_type="JobFailed").exists()


def test_another_tenants_events_never_reach_an_endpoint(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(TenantFactory())
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()
    assert due_deliver_runs() == []


def test_a_disabled_endpoint_gets_no_new_deliveries(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status="disabled")
    complete_a_job(tenant)
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()


def test_the_delivery_is_written_with_the_event_or_not_at_all(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    job = RunningJobFactory(tenant=tenant)
    with pytest.raises(RuntimeError), transaction.atomic():
        publish("JobCompleted", {"job_id": job.pk}, tenant=tenant, aggregate=job)
        assert WebhookDelivery.objects.filter(endpoint=endpoint).count() == 1
        raise RuntimeError("the transaction rolls back")
    assert not WebhookDelivery.objects.filter(endpoint=endpoint).exists()
    assert due_deliver_runs() == []


def test_an_attempt_run_twice_sends_once(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    (row,) = due_deliver_runs()
    run_attempt(row)
    run_attempt(row)  # the broker delivered the message again
    assert len(receiver.requests()) == 1


def test_an_endpoint_failing_for_days_is_disabled_with_its_reason(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_RETRY_DELAYS = [60.0] * 20
    endpoint = make_endpoint(receiver.url)
    receiver.default = Reply(status=502)
    start = timezone.now()
    with time_machine.travel(start, tick=True) as traveller:
        complete_a_job(tenant)
        run_due_attempts()
        endpoint.refresh_from_db()
        assert endpoint.status == "active" and endpoint.failing_since is not None

        traveller.move_to(start + timedelta(days=4))
        run_due_attempts()
        endpoint.refresh_from_db()
        assert endpoint.status == "active"

        traveller.move_to(start + timedelta(days=5, hours=1))
        run_due_attempts()
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled"
    assert "failed for 5 days" in endpoint.disabled_reason
    assert "HTTP 502" in endpoint.disabled_reason
    # What was still pending for it is held for its enable, with no run trying on.
    run_due_attempts()
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.scheduled_run_id is None
    assert due_deliver_runs() == []


def test_a_success_clears_the_failing_mark(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=500))
    complete_a_job(tenant)
    run_due_attempts()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is not None
    run_due_attempts()
    endpoint.refresh_from_db()
    assert endpoint.failing_since is None


def test_during_a_rotation_both_secrets_sign(receiver, make_endpoint, tenant, manager):
    from webhook.services import endpoint_rotate_secret

    endpoint = make_endpoint(receiver.url)
    old_secret = endpoint.secret
    new_secret = endpoint_rotate_secret(
        tenant=tenant, endpoint_id=endpoint.pk, actor=manager
    ).secret
    complete_a_job(tenant)
    run_due_attempts()
    (request,) = receiver.requests()
    assert len(request.headers["webhook-signature"].split(" ")) == 2
    Webhook(old_secret).verify(request.body, request.headers)
    Webhook(new_secret).verify(request.body, request.headers)


def test_the_body_is_the_same_json_on_every_attempt(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    receiver.script(Reply(status=500))
    complete_a_job(tenant)
    run_due_attempts()
    run_due_attempts()
    one, two = receiver.requests()
    assert one.body == two.body
    assert json.loads(one.body)["type"] == "JobCompleted"


def test_an_endpoint_answering_fast_is_marked_so_and_a_slow_answer_clears_it(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_SLOW_SECONDS = 0.2
    endpoint = make_endpoint(receiver.url)
    assert not endpoint.answers_fast
    complete_a_job(tenant)
    run_due_attempts()
    endpoint.refresh_from_db()
    assert endpoint.answers_fast

    receiver.script(Reply(delay=0.3))  # delivered, but slower than the mark
    complete_a_job(tenant)
    run_due_attempts()
    endpoint.refresh_from_db()
    assert not endpoint.answers_fast


def test_a_failing_endpoints_new_deliveries_wait_for_its_next_success(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()  # fails: the endpoint is failing, its delivery retries

    complete_a_job(tenant)
    complete_a_job(tenant)
    parked = list(WebhookDelivery.objects.filter(endpoint=endpoint, attempts=0))
    assert len(parked) == 2
    # No run of their own: nothing tries (and times out) while the endpoint fails.
    assert all(d.scheduled_run_id is None for d in parked)
    assert len(due_deliver_runs()) == 1

    run_due_attempts()  # the retry succeeds, and takes the parked deliveries up
    run_due_attempts()

    assert len(receiver.requests()) == 4
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {"delivered"}


def test_parked_deliveries_are_held_when_their_endpoint_is_disabled(
    receiver, make_endpoint, tenant, manager
):
    from webhook.services import endpoint_disable

    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()
    complete_a_job(tenant)
    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    parked = WebhookDelivery.objects.get(endpoint=endpoint, attempts=0)
    assert parked.status == "pending" and parked.scheduled_run_id is None


def test_a_final_failure_hands_the_search_to_a_parked_delivery(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_RETRY_DELAYS = [1.0]
    endpoint = make_endpoint(receiver.url)
    receiver.default = Reply(status=503)
    start = timezone.now()
    with time_machine.travel(start, tick=True) as traveller:
        complete_a_job(tenant)
        run_due_attempts()
        complete_a_job(tenant)  # parked
        traveller.move_to(start + timedelta(seconds=2))
        run_due_attempts()  # the first delivery's last retry fails: the parked one is scheduled
    first, second = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id")
    assert first.status == "failed"
    assert second.scheduled_run_id is not None
    receiver.default = Reply(status=200)
    run_due_attempts()
    second.refresh_from_db()
    assert second.status == "delivered"


def test_a_new_url_takes_up_the_deliveries_parked_while_the_old_one_failed(
    receiver, make_endpoint, tenant, manager
):
    from webhook.services import endpoint_update

    endpoint = make_endpoint(receiver.url + "/old")
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()
    complete_a_job(tenant)  # parked

    endpoint_update(
        tenant=tenant, endpoint_id=endpoint.pk, data={"url": receiver.url + "/new"}, actor=manager
    )
    run_due_attempts()

    assert sorted(r.path for r in receiver.requests()) == ["/hooks/new", "/hooks/new", "/hooks/old"]


@pytest.mark.parametrize("status", ["active", "disabled"])
@pytest.mark.parametrize("wanted", [["JobCompleted"], ["JobFailed", "JobCompleted"], ["JobFailed"]])
def test_the_listeners_interest_holds_exactly_where_its_read_finds_endpoints(
    receiver, make_endpoint, tenant, status, wanted
):
    """The event's statement asks whether an endpoint wants the event, and the listener is
    called only then: a condition stricter than the listener's own read would lose
    deliveries. Both are asked for each event type, this tenant's and another's."""
    endpoint = make_endpoint(receiver.url, event_types=wanted)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status=status)
    other = TenantFactory()
    for tenant_id in (tenant.pk, other.pk, None):
        for event_type in (*TENANT_EVENT_TYPES, "TaskFailed", "WorkerRegistered"):
            condition = deliveries_wanted(event_type, tenant_id)
            found = (
                tenant_id is not None
                and event_type in TENANT_EVENT_TYPES
                and (
                    WebhookEndpoint.objects.filter(
                        tenant_id=tenant_id, status="active", event_types__contains=[event_type]
                    ).exists()
                )
            )
            if condition is None:
                assert not found, (event_type, tenant_id)
                continue
            with connection.cursor() as cursor:
                cursor.execute(condition.sql, condition.params)
                (holds,) = cursor.fetchone()
            assert holds == found, (event_type, tenant_id, status, wanted)
