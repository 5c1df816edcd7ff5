"""A delivery that ends failed because its retries ran out says so, with the last answer it
got: a tenant reading it learns that the hub gave up (not that the receiver refused it for
good), after how many attempts, and on what."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from tests.webhook.conftest import Reply, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.models import WebhookAttempt, WebhookDelivery

pytestmark = pytest.mark.django_db


def fail_until_spent(tenant) -> None:
    start = timezone.now()
    with time_machine.travel(start, tick=True) as traveller:
        complete_a_job(tenant)
        # Each attempt when its run is due (the tests' schedule spans 7 s of the clock).
        for step in range(20):
            traveller.move_to(start + timedelta(seconds=4 * step))
            if not run_due_attempts():
                break


@pytest.mark.parametrize(
    ("reply", "last"),
    [
        pytest.param(Reply(status=503), "HTTP 503", id="5xx"),
        pytest.param(
            Reply(status=429, headers={"Retry-After": "1"}), "HTTP 429", id="too-many-requests"
        ),
    ],
)
def test_a_delivery_whose_retries_ran_out_says_so(
    receiver, make_endpoint, tenant, settings, reply, last
):
    endpoint = make_endpoint(receiver.url)
    receiver.default = reply

    fail_until_spent(tenant)

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    attempts = len(settings.WEBHOOK_RETRY_DELAYS) + 1
    assert delivery.last_error == f"retries spent after {attempts} attempts; the last: {last}"
    # Each attempt keeps what it got.
    assert set(
        WebhookAttempt.objects.filter(delivery=delivery).values_list("error", flat=True)
    ) == {""}


def test_a_timeout_whose_retries_ran_out_keeps_the_timeout_in_its_reason(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_TIMEOUT = 0.3
    endpoint = make_endpoint(receiver.url)
    receiver.default = Reply(delay=5.0)

    fail_until_spent(tenant)

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error.startswith("retries spent after 4 attempts; the last: timeout: ")
