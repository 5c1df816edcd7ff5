"""Internationalized host names: the name goes on the wire in its IDNA form (the A-label,
``xn--...``) for the lookup, the Host header, SNI and the certificate check alike."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from tests.webhook.conftest import run_due_attempts
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
    """A TLS receiver on loopback whose certificate is issued for xn--bcher-kva.example;
    it keeps the name each client asked for in SNI."""
    ca = trustme.CA()
    cert = ca.issue_cert("xn--bcher-kva.example")
    received: list[dict[str, str]] = []
    server_names: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)

    def remember(_socket, server_name, _context):
        server_names.append(server_name)

    context.sni_callback = remember
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with ca.cert_pem.tempfile() as ca_file:
        yield server.server_address[1], ca_file, received, server_names
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("name", ["bücher.example", "BÜCHER.example.", "xn--bcher-kva.example"])
def test_an_internationalized_name_is_delivered_over_https(
    idn_https_receiver, make_endpoint, tenant, settings, monkeypatch, name
):
    port, ca_file, received, server_names = idn_https_receiver
    settings.WEBHOOK_CA_BUNDLE = ca_file
    fake_dns(monkeypatch, {"xn--bcher-kva.example": ["127.0.0.1"]})
    endpoint = make_endpoint(f"https://{name}:{port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == "delivered", delivery.last_error
    assert server_names == ["xn--bcher-kva.example"]
    assert [headers["host"] for headers in received] == [f"xn--bcher-kva.example:{port}"]


def test_the_certificate_of_another_name_is_still_refused(
    idn_https_receiver, make_endpoint, tenant, settings, monkeypatch
):
    port, ca_file, received, _names = idn_https_receiver
    settings.WEBHOOK_CA_BUNDLE = ca_file
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
