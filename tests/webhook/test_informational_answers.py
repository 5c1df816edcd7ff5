"""An informational answer (1xx) comes before the receiver's real answer: HTTP clients
must read past it, so a receiver that sends 103 Early Hints, or 102 Processing while it
works, is judged on its final answer, not failed for good on the first line it sent."""

from __future__ import annotations

import pytest

from tests.webhook.conftest import run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import transport
from webhook.models import WebhookDelivery

pytestmark = pytest.mark.django_db

EARLY_HINTS = b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>; rel=preload\r\n\r\n"
PROCESSING = b"HTTP/1.1 102 Processing\r\n\r\n"
CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


@pytest.mark.parametrize(
    "informational",
    [
        pytest.param(EARLY_HINTS, id="103"),
        pytest.param(PROCESSING + CONTINUE + EARLY_HINTS, id="102-100-103"),
    ],
)
def test_a_delivery_answered_after_informational_answers_is_delivered(
    raw_receiver, make_endpoint, tenant, informational
):
    receiver = raw_receiver(informational + OK)
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.DELIVERED
    assert delivery.last_status_code == 200


def test_the_final_answer_after_an_informational_one_is_what_is_read(raw_receiver):
    receiver = raw_receiver(
        EARLY_HINTS + b"HTTP/1.1 503 Busy\r\nRetry-After: 7\r\nContent-Length: 4\r\n\r\nbusy"
    )

    answer = transport.post(receiver.url, b"{}", {})

    assert (answer.status_code, answer.excerpt, answer.retry_after) == (503, "busy", 7.0)
