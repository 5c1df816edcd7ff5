"""What a receiver sends that is not a well-formed HTTP answer (another protocol's
greeting on a non-HTTP port, a head too large, a body cut short or badly framed, a Location no URL
parser reads, redirects without end) is recorded with a reason that says which, and
decided on like the transport's other failures: never an exception out of the transport."""

from __future__ import annotations

import pytest

from tests.webhook.conftest import run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import transport
from webhook.models import WebhookDelivery

pytestmark = pytest.mark.django_db

NOT_HTTP = "connection error: the answer is not HTTP"
HEAD_TOO_LARGE = "connection error: the answer's head is too large"
BODY_CUT = "connection error: the answer's body was cut short or malformed"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        pytest.param(b"SSH-2.0-OpenSSH_9.6\r\n", NOT_HTTP, id="ssh-greeting"),
        pytest.param(b"220 mail.example.com ESMTP\r\n", NOT_HTTP, id="smtp-greeting"),
        pytest.param(
            b"HTTP/1.1 200 OK\r\n"
            + b"".join(b"X-%d: a\r\n" % number for number in range(101))
            + b"Content-Length: 0\r\n\r\n",
            HEAD_TOO_LARGE,
            id="101-headers",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nX-Long: " + b"a" * 70_000 + b"\r\nContent-Length: 0\r\n\r\n",
            HEAD_TOO_LARGE,
            id="70-kb-header",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nok",
            BODY_CUT,
            id="body-cut-short",
        ),
        pytest.param(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
            # (http.client reads a broken chunk's size as the body ending there)
            BODY_CUT,
            id="bad-chunk",
        ),
        pytest.param(
            b"",
            "connection error: the connection closed before an answer",
            id="closed-without-answer",
        ),
    ],
)
def test_an_answer_that_is_not_valid_http_is_told_for_what_it_is(
    raw_receiver, make_endpoint, tenant, answer, error
):
    receiver = raw_receiver(answer)
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.last_error == error
    # A receiver's failure like a timeout: retried, not final.
    assert delivery.status == WebhookDelivery.Status.PENDING


@pytest.mark.parametrize("location", ["http://[::1", "http://[::1]:99999/", "http://a b:x/"])
def test_a_redirect_to_no_url_is_refused_for_good(
    raw_receiver, make_endpoint, tenant, settings, location
):
    settings.WEBHOOK_MAX_REDIRECTS = 1
    receiver = raw_receiver(
        b"HTTP/1.1 307 Moved\r\nLocation: " + location.encode() + b"\r\nContent-Length: 0\r\n\r\n"
    )
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error.startswith("refused: redirect refused: not a valid URL")


def test_redirects_without_end_stop_at_the_bound_and_say_so(receiver, settings):
    from tests.webhook.conftest import Reply

    settings.WEBHOOK_MAX_REDIRECTS = 2
    receiver.default = Reply(status=307, headers={"Location": "/hooks"})

    answer = transport.post(receiver.url, b"{}", {})

    assert len(receiver.requests()) == 3
    assert answer.status_code == 307
    assert answer.error == "redirect to /hooks not followed: more than 2 redirects"
