"""Where a delivery may go: public addresses only (loopback too when a setting allows it),
checked after DNS resolution, connected to the checked address itself."""

from __future__ import annotations

import socket

import pytest
from rest_framework.test import APIClient

from tests.ports import free_port
from tests.webhook.conftest import Reply, run_due_attempts, tls_receiver
from tests.webhook.test_delivery import complete_a_job
from webhook import transport
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint

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
    "fec0::1",  # site-local (deprecated, yet routed inside some networks)
    "fec0:1::2",
    "feff::1",
    "::127.0.0.1",  # IPv4-compatible loopback
    "64:ff9b:1::a00:1",  # local-use NAT64 of 10.0.0.1
    "2001:db8::1",  # documentation
    "3fff::1",  # documentation (2024)
    "192.0.0.8",  # IETF protocol assignments
    "240.0.0.1",  # reserved
    "255.255.255.255",
]
PUBLIC = [
    "8.8.8.8",
    "1.1.1.1",
    "2606:4700:4700::1111",
    "93.184.216.34",
    "::ffff:8.8.8.8",
    "2002:808:808::1",  # 6to4 of 8.8.8.8
]


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
    assert delivery.last_error == "refused: the address is not public"


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
    with tls_receiver("hooks.example.test") as receiver:
        yield receiver


@pytest.mark.django_db
def test_https_keeps_the_name_for_sni_and_the_certificate(
    https_receiver, make_endpoint, tenant, settings, monkeypatch
):
    port, received = https_receiver.port, https_receiver.received
    settings.WEBHOOK_CA_BUNDLE = https_receiver.ca_file
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


# --- one host, however it is written ----------------------------------------------------------

# Every way of writing one host that a resolver (inet_aton, IDNA's UTS-46 mapping) reads as
# the same: the decision is made on the form the connection would use.
CANONICAL_FORMS = [
    ("127.0.0.1", "127.0.0.1"),
    ("127.1", "127.0.0.1"),
    ("127.0.1", "127.0.0.1"),
    ("2130706433", "127.0.0.1"),
    ("0x7f000001", "127.0.0.1"),
    ("0X7F.0.0.1", "127.0.0.1"),
    ("0177.0.0.01", "127.0.0.1"),
    ("0x7f.1", "127.0.0.1"),
    ("3232235777", "192.168.1.1"),
    ("192.168.0x1.1", "192.168.1.1"),
    ("0", "0.0.0.0"),  # noqa: S104 (an address decided on, not bound)
    ("\uff11\uff12\uff17.\uff10.\uff10.\uff11", "127.0.0.1"),  # full-width digits
    ("127\u30020\u30020\u30021", "127.0.0.1"),  # ideographic full stops
    ("127.0.0.1.", "127.0.0.1"),  # a trailing dot
    ("134744072", "8.8.8.8"),
    ("::FFFF:127.0.0.1", "::ffff:7f00:1"),
    ("0:0:0:0:0:0:0:1", "::1"),
    ("Hooks.Example.COM.", "hooks.example.com"),
    ("LOCALHOST.", "localhost"),
    ("\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54", "localhost"),
    ("b\u00fccher.example", "xn--bcher-kva.example"),
    ("B\u00dcCHER.Example", "xn--bcher-kva.example"),
    ("xn--bcher-kva.example", "xn--bcher-kva.example"),
    ("\u043f\u0440\u0438\u043c\u0435\u0440.example", "xn--e1afmkfd.example"),
    ("_dmarc.example.com", "_dmarc.example.com"),
]
INVALID_HOSTS = [
    "",
    ".",
    "a..b",
    "1.2.3.256",
    "4294967296",
    "0x1g.0.0.1",
    "1.2.3.4.5",
    "example.123",  # ends in a number, yet is no IPv4 address
    "exa mple.com",
    "a<b.example",
    "a%20b.example",
    "xn--zz.example",  # not a valid A-label
    "a" * 64 + ".example",
    ("a" * 60 + ".") * 5 + "example",  # over 253 characters
]


@pytest.mark.parametrize(("written", "canonical"), CANONICAL_FORMS)
def test_a_host_is_decided_on_in_its_canonical_form(written, canonical):
    assert transport.canonical_host(written) == canonical


@pytest.mark.parametrize("host", INVALID_HOSTS)
def test_a_host_no_resolver_would_read_one_way_is_invalid(host):
    with pytest.raises(transport.InvalidHost):
        transport.canonical_host(host)


NON_PUBLIC_URLS = [
    f"https://{written}/hooks" if ":" not in canonical else f"https://[{written}]/hooks"
    for written, canonical in CANONICAL_FORMS
    if canonical not in ("8.8.8.8",) and "example" not in canonical
] + ["https://[fec0::1]/hooks", "https://[::ffff:7f00:1]/hooks", "https://[3fff::1]/hooks"]


@pytest.mark.django_db
@pytest.mark.parametrize("url", NON_PUBLIC_URLS)
def test_registration_refuses_every_form_of_a_non_public_host(settings, tenant, manager, url):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    api = APIClient()
    api.force_authenticate(manager)
    response = api.post(
        "/api/v1/webhooks", {"url": url, "event_types": ["JobCompleted"]}, format="json"
    )
    assert response.status_code == 400, (url, response.content)
    assert response.json()["error"]["code"] == "webhook_url_refused"
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("host", [host for host in INVALID_HOSTS if host])
def test_registration_refuses_an_invalid_host_with_a_400(settings, tenant, manager, host):
    api = APIClient()
    api.force_authenticate(manager)
    response = api.post(
        "/api/v1/webhooks",
        {"url": f"https://{host}/hooks", "event_types": ["JobCompleted"]},
        format="json",
    )
    assert response.status_code == 400, (host, response.content)
    assert response.json()["error"]["code"] in ("webhook_url_refused", "invalid")
    assert not WebhookEndpoint.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("written", ["127.1", "2130706433", "0x7f000001", "127.0.0.1."])
def test_delivery_refuses_the_same_forms_as_registration(
    receiver, make_endpoint, tenant, settings, written
):
    # A row from before the rule: registration would refuse it now, delivery still must.
    endpoint = make_endpoint(receiver.url)
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        url=f"http://{written}:{receiver.port}/hooks"
    )
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    complete_a_job(tenant)

    run_due_attempts()

    assert receiver.requests() == []
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.FAILED
    assert delivery.last_error.startswith("refused")


@pytest.mark.django_db
def test_development_connects_to_the_canonical_form_too(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(f"http://2130706433:{receiver.port}/hooks")
    complete_a_job(tenant)

    run_due_attempts()

    (request,) = receiver.requests()
    assert request.headers["host"] == f"127.0.0.1:{receiver.port}"
    assert WebhookDelivery.objects.get(endpoint=endpoint).status == "delivered"


# --- what a delivery's error tells the tenant -------------------------------------------------


def hub_internals(error: str) -> list[str]:
    """What of the hub's own network an error would give away."""
    return [
        secret
        for secret in ("127.0.0.1", "10.1.2.3", "::1", "Errno", "HTTPConnectionPool", "host=")
        if secret in error
    ]


@pytest.mark.django_db
def test_a_refused_address_is_told_in_the_tenants_terms_and_logged_in_full(
    make_endpoint, tenant, settings, monkeypatch, caplog
):
    fake_dns(monkeypatch, {"hooks.example.com": ["10.1.2.3", "127.0.0.1"]})
    endpoint = make_endpoint("https://hooks.example.com/hooks")
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    complete_a_job(tenant)

    with caplog.at_level("WARNING", logger="hubdommed.webhook"):
        run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.last_error == "refused: the address is not public"
    attempt = WebhookAttempt.objects.get(delivery=delivery)
    assert attempt.error == delivery.last_error
    # The operators still learn what the resolver answered.
    assert "10.1.2.3" in caplog.text and "127.0.0.1" in caplog.text


@pytest.mark.django_db
def test_a_name_that_does_not_resolve_is_told_so(make_endpoint, tenant, monkeypatch, caplog):
    def getaddrinfo(host, port, *args, **kwargs):
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(transport.socket, "getaddrinfo", getaddrinfo)
    endpoint = make_endpoint("https://hooks.example.com/hooks")
    complete_a_job(tenant)

    with caplog.at_level("WARNING", logger="hubdommed.webhook"):
        run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    # Retried: a name may resolve again.
    assert delivery.status == WebhookDelivery.Status.PENDING
    assert delivery.last_error == "connection error: the name did not resolve"
    assert "Name or service not known" in caplog.text


@pytest.fixture
def closed_port():
    return free_port()


@pytest.mark.django_db
@pytest.mark.parametrize("failure", ["refused", "timeout", "certificate"])
def test_no_error_of_a_delivery_gives_the_hubs_network_away(
    failure, receiver, https_receiver, closed_port, make_endpoint, tenant, settings, monkeypatch
):
    fake_dns(monkeypatch, {"hooks.example.com": ["127.0.0.1"]})
    if failure == "refused":
        url = f"http://hooks.example.com:{closed_port}/hooks"
    elif failure == "timeout":
        receiver.default = Reply(delay=5.0)
        url = f"http://hooks.example.com:{receiver.port}/hooks"
    else:
        settings.WEBHOOK_CA_BUNDLE = https_receiver.ca_file
        # The certificate names another host.
        url = f"https://hooks.example.com:{https_receiver.port}/hooks"
    endpoint = make_endpoint(url)
    complete_a_job(tenant)

    run_due_attempts()

    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    assert delivery.status == WebhookDelivery.Status.PENDING  # retried
    assert delivery.last_error.startswith(("connection error: ", "timeout: "))
    assert hub_internals(delivery.last_error) == [], delivery.last_error
    assert delivery.last_error == WebhookAttempt.objects.get(delivery=delivery).error
