"""Internationalized host names: the name goes on the wire in its IDNA form (the A-label,
``xn--...``) for the lookup, the Host header, SNI and the certificate check alike."""

from __future__ import annotations

import pytest

from tests.webhook.conftest import run_due_attempts, tls_receiver
from tests.webhook.test_delivery import complete_a_job
from tests.webhook.test_safety import fake_dns
from webhook.models import WebhookDelivery

pytestmark = pytest.mark.django_db

# (the name as a tenant writes it, its A-label form); the second is not Latin-1, which an
# HTTP header written as it is cannot carry at all.
NAMES = [
    ("bücher.example", "xn--bcher-kva.example"),
    ("пример.example", "xn--e1afmkfd.example"),
    ("例え.テスト", "xn--r8jz45g.xn--zckzah"),
    ("ＢÜＣＨＥＲ.example", "xn--bcher-kva.example"),  # full-width and upper case: one name
]


@pytest.mark.parametrize(("name", "a_label"), NAMES)
def test_an_internationalized_name_is_delivered_over_http(
    receiver, make_endpoint, tenant, monkeypatch, name, a_label
):
    lookups = fake_dns(monkeypatch, {a_label: ["127.0.0.1"]})
    endpoint = make_endpoint(f"http://{name}:{receiver.port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "delivered", delivery.last_error
    (request,) = receiver.requests()
    assert request.headers["host"] == f"{a_label}:{receiver.port}"
    assert lookups == [a_label, "127.0.0.1"]
    # The tenant's URL is kept as it was written.
    endpoint.refresh_from_db()
    assert endpoint.url == f"http://{name}:{receiver.port}/hooks"


@pytest.fixture
def idn_https_receiver():
    """A TLS receiver whose certificate is issued for xn--bcher-kva.example."""
    with tls_receiver("xn--bcher-kva.example") as receiver:
        yield receiver


@pytest.mark.parametrize("name", ["bücher.example", "BÜCHER.example.", "xn--bcher-kva.example"])
def test_an_internationalized_name_is_delivered_over_https(
    idn_https_receiver, make_endpoint, tenant, settings, monkeypatch, name
):
    port, received = idn_https_receiver.port, idn_https_receiver.received
    settings.WEBHOOK_CA_BUNDLE = idn_https_receiver.ca_file
    fake_dns(monkeypatch, {"xn--bcher-kva.example": ["127.0.0.1"]})
    endpoint = make_endpoint(f"https://{name}:{port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "delivered", delivery.last_error
    assert idn_https_receiver.server_names == ["xn--bcher-kva.example"]
    assert [headers["host"] for headers in received] == [f"xn--bcher-kva.example:{port}"]


def test_the_certificate_of_another_name_is_still_refused(
    idn_https_receiver, make_endpoint, tenant, settings, monkeypatch
):
    port, received = idn_https_receiver.port, idn_https_receiver.received
    settings.WEBHOOK_CA_BUNDLE = idn_https_receiver.ca_file
    fake_dns(
        monkeypatch, {"xn--bcher-kva.example": ["127.0.0.1"], "xn--e1afmkfd.example": ["127.0.0.1"]}
    )
    endpoint = make_endpoint(f"https://пример.example:{port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "pending" and delivery.last_status_code is None
    assert "certificate" in delivery.last_error.lower()
    assert received == []
