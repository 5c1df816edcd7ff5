"""Connections kept per receiver: reused only for the address the request's own check
allowed, bounded in number, closed when idle or when an answer was not read whole."""

from __future__ import annotations

import pytest

from tests.webhook.conftest import Receiver, Reply, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from tests.webhook.test_safety import fake_dns
from webhook import transport
from webhook.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def test_deliveries_to_one_receiver_share_a_kept_connection(receiver, make_endpoint, tenant):
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)

    assert run_due_attempts() == 2

    first, second = receiver.requests()
    assert first.client_port == second.client_port
    assert WebhookDelivery.objects.filter(status="delivered").count() == 2


def test_a_kept_connection_is_not_reused_for_another_address_of_the_name(
    receiver, make_endpoint, tenant, monkeypatch
):
    # The name first resolves to the receiver, then (rebinding) to another loopback
    # address where nothing listens on that port: the kept connection to the first
    # address must not carry the second request.
    answers = {"hooks.example.test": ["127.0.0.1"]}
    fake_dns(monkeypatch, answers)
    endpoint = make_endpoint(f"http://hooks.example.test:{receiver.port}/hooks")
    complete_a_job(tenant)
    run_due_attempts()
    answers["hooks.example.test"] = ["127.0.0.2"]
    complete_a_job(tenant)

    run_due_attempts()

    assert len(receiver.requests()) == 1
    second = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id").last()
    assert second.status == "pending"
    assert second.last_error.startswith("connection error: could not connect")


def test_a_connection_idle_past_its_bound_is_closed(
    receiver, make_endpoint, tenant, monkeypatch, kept_connections
):
    # Idle past the bound as soon as it is kept: each request gets a new connection.
    monkeypatch.setattr(transport, "POOL_IDLE_SECONDS", 0.0)
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)

    run_due_attempts()

    first, second = receiver.requests()
    assert first.client_port != second.client_port


def test_an_answer_not_read_whole_leaves_no_connection_kept(
    receiver, make_endpoint, tenant, settings
):
    settings.WEBHOOK_MAX_RESPONSE_BYTES = 16
    receiver.script(Reply(body=b"x" * 100_000))
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)

    run_due_attempts()

    first, second = receiver.requests()
    # The rest of the first answer was never read: its connection is not the second's.
    assert first.client_port != second.client_port
    assert WebhookDelivery.objects.filter(status="delivered").count() == 2


def test_the_receivers_kept_are_bounded(make_endpoint, tenant, monkeypatch, kept_connections):
    monkeypatch.setattr(transport, "POOLS_KEPT", 2)
    receivers = [Receiver() for _ in range(3)]
    try:
        for server in receivers:
            server.thread.start()
            make_endpoint(server.url)
        complete_a_job(tenant)

        assert run_due_attempts() == 3

        assert len(kept_connections) == 2
        assert all(len(server.requests()) == 1 for server in receivers)
    finally:
        for server in receivers:
            server.server.shutdown()
            server.server.server_close()


def test_a_kept_connection_the_receiver_closed_is_replaced_without_a_failure(
    receiver, make_endpoint, tenant
):
    # The receiver answers, then closes the connection: the next request finds the kept
    # one dead and goes over a new one.
    receiver.script(Reply(headers={"Connection": "close"}))
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)

    run_due_attempts()

    first, second = receiver.requests()
    assert first.client_port != second.client_port
    assert WebhookDelivery.objects.filter(status="delivered").count() == 2
