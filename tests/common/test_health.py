import socket

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_live_answers_ok():
    response = Client().get("/health/live")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_ready_checks_postgres_redis_and_the_broker():
    response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"] == {"postgres": "ok", "redis": "ok", "broker": "ok"}


def test_ready_names_the_dependency_that_failed(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    body = response.json()
    assert body["failed"] == ["redis"]
    assert body["checks"]["postgres"] == "ok"
    assert body["checks"]["redis"].startswith("error")


def test_ready_reports_an_unreachable_broker(settings):
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{closed_port()}/%2F"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]


def test_the_openapi_schema_and_docs_are_served():
    client = Client()
    schema = client.get("/api/schema/", HTTP_ACCEPT="application/json")
    assert schema.status_code == 200
    assert schema.json()["info"]["title"] == "Hub DomMed API"
    assert client.get("/api/docs/").status_code == 200


def test_ready_checks_sqs_when_it_is_the_broker(settings, moto_endpoint):
    settings.BROKER = "sqs"
    settings.SQS_ENDPOINT_URL = moto_endpoint
    response = Client().get("/health/ready")
    assert response.status_code == 200, response.json()
    assert response.json()["checks"]["broker"] == "ok"

    settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{closed_port()}"
    response = Client().get("/health/ready")
    assert response.status_code == 503
    assert response.json()["failed"] == ["broker"]


def test_the_schema_is_served_even_with_a_stale_token():
    response = Client().get(
        "/api/schema/", HTTP_ACCEPT="application/json", HTTP_AUTHORIZATION="Bearer expired.token"
    )
    assert response.status_code == 200
