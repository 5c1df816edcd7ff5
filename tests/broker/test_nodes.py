"""RABBITMQ_URL with several nodes: a lost or refused node moves each connection to the next.

Two private RabbitMQ nodes (not clustered: what is proved here is the hub's side, that it
reaches the next address; a cluster's queues being on every node is RabbitMQ's).
"""

from __future__ import annotations

import contextlib
import json

import pika.exceptions
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import Client

from broker.rabbitmq.connection import broker_nodes
from broker.rabbitmq.consumer import RabbitMQConsumer
from common import health
from common.env import Env
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from tests.ports import free_port
from tests.relay.conftest import RabbitConsumer, run_ids
from tests.relay.test_broker_refusals import passes_until, relay_command

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def two_nodes(private_rabbitmq_factory):
    return private_rabbitmq_factory(), private_rabbitmq_factory()


def dead_url() -> str:
    return f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"


def taken(url: str, destination: str):
    consumer = RabbitConsumer(url)
    try:
        return run_ids(envelope for _, envelope in consumer.take_all(destination))
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError):
            consumer.close()


def test_the_relay_goes_on_to_the_next_node_when_its_node_dies(settings, two_nodes):
    first, second = two_nodes
    first.start()
    second.start()
    settings.RABBITMQ_URL = f"{first.url},{second.url}"
    command = relay_command()
    try:
        with transaction.atomic():
            before = [dispatch("maintenance.purge", {"n": n}) for n in range(10)]
        passes_until(
            command, lambda: not PlatformOutboxMessage.objects.filter(sent_at=None).exists()
        )
        first.stop()
        with transaction.atomic():
            after = [dispatch("maintenance.purge", {"n": n}) for n in range(10, 20)]
        passes_until(
            command,
            lambda: not PlatformOutboxMessage.objects.filter(sent_at=None).exists(),
            timeout=60,
        )
    finally:
        command.relay.close()
        first.start()

    # Both queues emptied before anything is asserted, so that the module's next test finds
    # them empty whatever this one finds.
    on_first = set(taken(first.url, "maintenance"))
    on_second = set(taken(second.url, "maintenance"))
    # This test's own rows, each on the node it was relayed to: a row another test of the
    # worker left unsent in its database is relayed with them, and is not this test's.
    ours_before, ours_after = {str(r) for r in before}, {str(r) for r in after}
    ours = ours_before | ours_after
    assert on_first & ours == ours_before
    assert on_second & ours == ours_after


def test_a_worker_consumes_from_the_first_node_that_answers(settings, two_nodes):
    _, second = two_nodes
    second.start()
    settings.RABBITMQ_URL = f"{dead_url()},{second.url}"
    consumer = RabbitMQConsumer()
    try:
        consumer.start(["maintenance"], prefetch=4)
        connection = pika.BlockingConnection(pika.URLParameters(second.url))
        try:
            connection.channel().basic_publish(
                "", settings.QUEUE_PREFIX + "maintenance", json.dumps({"run_id": "x"}).encode()
            )
        finally:
            connection.close()
        deliveries = []
        for _ in range(50):
            deliveries += consumer.poll(0.1)
            if deliveries:
                break
        assert [json.loads(d.body) for d in deliveries] == [{"run_id": "x"}]
        consumer.ack(deliveries[0])
    finally:
        consumer.close()


def test_readiness_is_200_while_one_node_of_the_list_answers(settings, two_nodes):
    _, second = two_nodes
    second.start()
    settings.RABBITMQ_URL = f"{dead_url()},{second.url}"
    health.forget()
    response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["broker"] == "ok"


def test_the_setting_takes_a_list_and_checks_each_url(monkeypatch):
    monkeypatch.setenv("RABBITMQ_URL", " amqp://a:5672/%2F , amqps://b:5671/%2F ")
    value = Env().urls("RABBITMQ_URL", "amqp://x/", schemes=("amqp", "amqps"))
    assert broker_nodes(value) == ["amqp://a:5672/%2F", "amqps://b:5671/%2F"]
    monkeypatch.setenv("RABBITMQ_URL", "amqp://a:5672/%2F,http://b/")
    with pytest.raises(ImproperlyConfigured, match="http://b/"):
        Env().urls("RABBITMQ_URL", "amqp://x/", schemes=("amqp", "amqps"))
    monkeypatch.setenv("RABBITMQ_URL", "amqp://a:5672/%2F,")
    with pytest.raises(ImproperlyConfigured, match="empty URL"):
        Env().urls("RABBITMQ_URL", "amqp://x/", schemes=("amqp", "amqps"))
