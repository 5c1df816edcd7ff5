"""``/metrics`` on the API: the text exposition, open unless a token is configured."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


def test_metrics_are_served_in_the_prometheus_text_format(client):
    client.get("/health/live")

    response = client.get("/metrics")

    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=")
    names = {family.name for family in text_string_to_metric_families(response.content.decode())}
    assert {
        "hubdommed_http_requests",
        "hubdommed_http_request_duration_seconds",
        "hubdommed_outbox_pending_messages",
        "hubdommed_outbox_oldest_due_age_seconds",
    } <= names


def test_with_a_token_configured_only_its_bearer_reads_the_metrics(client, settings):
    settings.METRICS_TOKEN = "s3cret-scrape-token"

    missing = client.get("/metrics")
    wrong = client.get("/metrics", HTTP_AUTHORIZATION="Bearer not-the-token")
    right = client.get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")

    for refused in (missing, wrong):
        assert refused.status_code == 401
        assert refused["WWW-Authenticate"].startswith("Bearer")
        assert refused.json()["error"]["code"] == "not_authenticated"
        assert b"hubdommed_" not in refused.content
    assert right.status_code == 200
    assert b"hubdommed_http_requests_total" in right.content


def test_only_reading_is_allowed(client):
    response = client.post("/metrics")

    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"
    assert response.json()["error"]["code"] == "method_not_allowed"
