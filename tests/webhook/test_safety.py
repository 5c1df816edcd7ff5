"""Where a delivery may go: public addresses only (loopback too when a setting allows it),
checked after DNS resolution, connected to the checked address itself."""

from __future__ import annotations

import socket
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme
from rest_framework.test import APIClient

from tests.webhook.conftest import run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook import transport
from webhook.models import WebhookDelivery, WebhookEndpoint

REFUSED_ALWAYS = [
    "169.254.169.254",  # the cloud's metadata service
    "169.254.1.1",
    "fd00:ec2::254",  # AWS's metadata service over IPv6
    "fe80::1",
    "0.0.0.0",  # noqa: S104 (an address refused, not bound)
    "224.0.0.1",
    "ff02::1",
    "::",
]
REFUSED_IN_PRODUCTION = [
    "127.0.0.1",
    "127.1.2.3",
    "::1",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "100.64.0.1",  # carrier-grade NAT
    "fc00::1",
    "::ffff:127.0.0.1",  # IPv4-mapped loopback
    "::ffff:10.0.0.1",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "2002:7f00:1::1",  # 6to4 of 127.0.0.1
    "192.0.2.1",  # documentation
    "198.18.0.1",  # benchmarking
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "93.184.216.34"]


@pytest.mark.parametrize("address", REFUSED_ALWAYS + REFUSED_IN_PRODUCTION)
def test_non_global_addresses_are_refused_in_production(address):
    assert not transport.address_allowed(address, allow_private=False)


@pytest.mark.parametrize("address", REFUSED_ALWAYS)
def test_metadata_and_link_local_are_refused_even_in_development(address):
    assert not transport.address_allowed(address, allow_private=True)


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "10.0.0.1", "192.168.1.1"])
def test_development_may_reach_loopback_and_private_networks(address):
    assert transport.address_allowed(address, allow_private=True)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_allowed(address):
    assert transport.address_allowed(address, allow_private=False)


def fake_dns(monkeypatch, answers: dict[str, list[str]]) -> list[str]:
    """Answer lookups of the given names (the tests have no DNS of their own); every lookup
    is counted, so a second one (a rebinding window) would show."""
    lookups: list[str] = []
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        lookups.append(host)
        if host in answers:
            return [
                (
                    socket.AF_INET6 if ":" in address else socket.AF_INET,
                    socket.SOCK_STREAM,
                    6,
                    "",
                    (address, port),
                )
                for address in answers[host]
            ]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(transport.socket, "getaddrinfo", getaddrinfo)
    return lookups


@pytest.mark.django_db
def test_a_private_address_is_refused_when_the_setting_is_off(
    receiver, make_endpoint, tenant, settings
):
    endpoint = make_endpoint(receiver.url)  # registered while development allowed it
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    complete_a_job(tenant)

    run_due_attempts()

    assert receiver.requests() == []
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    # The hub's own rule: final, no retry can change it.
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error.startswith("refused")


@pytest.mark.django_db
def test_a_name_resolving_to_a_private_address_is_refused_after_resolution(
    receiver, make_endpoint, tenant, settings, monkeypatch
):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    fake_dns(monkeypatch, {"hooks.example.com": ["10.1.2.3", "127.0.0.1"]})
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    # An https URL with a public-looking name passes registration; DNS tells the truth later.
    endpoint = make_endpoint(f"https://hooks.example.com:{receiver.port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    assert receiver.requests() == []
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert "resolves to no public address" in delivery.last_error


@pytest.mark.django_db
def test_the_connection_goes_to_the_checked_address_with_one_lookup(
    receiver, make_endpoint, tenant, monkeypatch
):
    # A name nothing else resolves: only our lookup's answer can lead to the receiver.
    lookups = fake_dns(monkeypatch, {"hooks.example.test": ["127.0.0.1"]})
    make_endpoint(f"http://hooks.example.test:{receiver.port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    (request,) = receiver.requests()
    assert request.headers["host"] == f"hooks.example.test:{receiver.port}"
    # The name was looked up once; the connection only "resolved" the checked address literal.
    assert lookups == ["hooks.example.test", "127.0.0.1"]


@pytest.fixture
def https_receiver():
    """A TLS receiver on loopback whose certificate names hooks.example.test."""
    ca = trustme.CA()
    cert = ca.issue_cert("hooks.example.test")
    received: list[dict[str, str]] = []

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
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    with ca.cert_pem.tempfile() as ca_file:
        yield server.server_address[1], ca_file, received
    server.shutdown()
    server.server_close()


@pytest.mark.django_db
def test_https_keeps_the_name_for_sni_and_the_certificate(
    https_receiver, make_endpoint, tenant, settings, monkeypatch
):
    port, ca_file, received = https_receiver
    settings.WEBHOOK_CA_BUNDLE = ca_file
    fake_dns(
        monkeypatch, {"hooks.example.test": ["127.0.0.1"], "other.example.test": ["127.0.0.1"]}
    )
    good = make_endpoint(f"https://hooks.example.test:{port}/hooks")
    wrong_name = make_endpoint(f"https://other.example.test:{port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    assert WebhookDelivery.objects.get(endpoint=good).status == "delivered"
    refused = WebhookDelivery.objects.get(endpoint=wrong_name)
    # Connected to the same address, but the certificate does not name this host.
    assert refused.status == "pending" and refused.last_status_code is None
    assert "certificate" in refused.last_error.lower() or "hostname" in refused.last_error
    assert len(received) == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/hooks",
        "https://127.0.0.1/hooks",
        "https://[::1]/hooks",
        "https://10.0.0.8/hooks",
        "https://169.254.169.254/latest/meta-data/",
        "https://localhost/hooks",
        "https://api.localhost/hooks",
        "https://user:pass@example.com/hooks",
        "ftp://example.com/hooks",
        "example.com/hooks",
        "https:///hooks",
    ],
)
def test_registration_refuses_what_production_cannot_deliver_to(settings, tenant, manager, url):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    api = APIClient()
    api.force_authenticate(manager)
    response = api.post(
        "/api/v1/webhooks", {"url": url, "event_types": ["JobCompleted"]}, format="json"
    )
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "webhook_url_refused"
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
def test_the_metadata_service_is_refused_even_in_development(tenant, manager):
    api = APIClient()
    api.force_authenticate(manager)
    response = api.post(
        "/api/v1/webhooks",
        {"url": "http://169.254.169.254/latest/meta-data/", "event_types": ["JobCompleted"]},
        format="json",
    )
    assert response.status_code == 400
