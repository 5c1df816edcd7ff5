"""A receiver's answer, and an exception's message, are stored whatever they hold: U+0000
(which PostgreSQL refuses in text) and a lone surrogate (which UTF-8 cannot encode) become
U+FFFD, and the delivery ends as its answer says, instead of its run failing at the INSERT
with the delivery left pending, to be sent again and again."""

from __future__ import annotations

import logging

import pytest
from django.db import transaction

from tests.webhook.conftest import Reply, due_deliver_runs, run_attempt, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import delivery as engine
from webhook.models import WebhookAttempt, WebhookDelivery

pytestmark = pytest.mark.django_db


def test_a_refusal_whose_body_holds_nul_is_recorded_and_final(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=400, body=b"a\0b\0c"))
    complete_a_job(tenant)

    assert run_due_attempts() == 1

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.attempts == 1
    assert delivery.last_status_code == 400
    assert delivery.next_attempt_at is None
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.response_excerpt == "a\ufffdb\ufffdc"
    # Sent once: nothing is left to send it again.
    assert len(receiver.requests()) == 1
    assert due_deliver_runs() == []


def test_successes_whose_body_holds_nul_are_recorded_every_way(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.default = Reply(status=200, body=b"ok\0")
    # The endpoint's first delivery goes the whole way (its receiver not known fast yet).
    complete_a_job(tenant)
    assert run_due_attempts() == 1
    # Then a run of three: the first recorded alone the fast way, the others as a batch.
    with transaction.atomic():
        for _ in range(3):
            complete_a_job(tenant)
    (row,) = due_deliver_runs()
    assert run_attempt(row) == ["delivered"] * 3

    deliveries = WebhookDelivery.objects.filter(endpoint=endpoint)
    assert [d.status for d in deliveries] == [WebhookDelivery.Status.DELIVERED] * 4
    excerpts = WebhookAttempt.objects.filter(delivery__endpoint=endpoint)
    assert list(excerpts.values_list("response_excerpt", flat=True)) == ["ok\ufffd"] * 4


def test_a_redirect_whose_location_holds_nul_is_recorded_and_final(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=307, headers={"Location": "/else\0where"}))
    complete_a_job(tenant)

    assert run_due_attempts() == 1

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error == "redirect to /else\ufffdwhere not followed"
    assert WebhookAttempt.objects.get(delivery=delivery).error == delivery.last_error
    assert len(receiver.requests()) == 1


def test_an_exception_sending_the_request_is_recorded_storable_and_retried(
    receiver, make_endpoint, tenant, monkeypatch, caplog
):
    def unsignable(**_):
        # What a library may raise: its message quotes the input it could not take.
        raise ValueError("cannot sign a\0b\ud800")

    monkeypatch.setattr(engine, "signed_headers", unsignable)
    # Its traceback, logged as it is, holds the surrogate: a report that carries it cannot
    # cross to pytest-xdist's controller (which encodes it as UTF-8).
    caplog.set_level(logging.CRITICAL, logger="hubdommed.webhook")
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)

    (row,) = due_deliver_runs()
    assert run_attempt(row) == ["retrying"]

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.attempts == 1
    assert delivery.last_error == "ValueError: cannot sign a\ufffdb\ufffd"
    assert delivery.next_attempt_at is not None
    assert receiver.requests() == []
