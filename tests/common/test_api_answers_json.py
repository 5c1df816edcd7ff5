"""Every answer under /api/ and /health/ is JSON, whatever the Accept header and DEBUG say.

``make run`` serves with DEBUG on: none of these paths may answer Django's debug pages (which
print settings and the environment) or DRF's browsable API. Errors keep the one format.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client

from tests.factories import UserFactory, bearer

pytestmark = [pytest.mark.urls("tests.common.urls"), pytest.mark.django_db]

SECRET_URLS = {
    "RABBITMQ_URL": "amqp://guest:rabbit-secret-pw@broker.internal:5672/%2F",
    "REDIS_URL": "redis://:redis-secret-pw@cache.internal:6379/0",
    "SQS_ENDPOINT_URL": "https://sqs-user:sqs-secret-pw@sqs.internal",
}
SECRETS = ("rabbit-secret-pw", "redis-secret-pw", "sqs-secret-pw", "broker.internal")

ACCEPT_HEADERS = [
    "text/html",
    "application/xml",
    "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8",
    "*/*",
    "application/json",
]


@pytest.fixture(params=[True, False], ids=["debug", "no-debug"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


@pytest.fixture
def client():
    # As a server answers: an exception becomes Django's response, it is not re-raised, and
    # CSRF is checked.
    return Client(raise_request_exception=False, enforce_csrf_checks=True)


def assert_json_error(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content[:500]
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}
    if code is not None:
        assert body["error"]["code"] == code
    return body["error"]


@pytest.mark.parametrize("accept", ACCEPT_HEADERS)
def test_a_list_is_json_whatever_the_client_accepts(client, debug, tenant, accept):
    member = UserFactory(tenant=tenant)
    response = client.get("/api/v1/jobs", HTTP_ACCEPT=accept, HTTP_AUTHORIZATION=bearer(member))
    assert response.status_code == 200, response.content[:500]
    assert response["Content-Type"] == "application/json"
    assert response.json()["results"] == []


@pytest.mark.parametrize("accept", ACCEPT_HEADERS)
def test_an_unauthenticated_call_is_a_json_401_whatever_the_client_accepts(client, debug, accept):
    assert_json_error(client.get("/api/v1/jobs", HTTP_ACCEPT=accept), 401, "not_authenticated")


@pytest.mark.parametrize(
    "method, path",
    [
        ("get", "/api/v1/no-such-thing"),
        ("post", "/api/v1/no-such-thing"),
        ("get", "/api/v1/jobs/not-a-number"),
        ("get", "/api/nothing"),
        ("delete", "/api/v1/"),
        ("get", "/health/nothing"),
    ],
)
@pytest.mark.parametrize("accept", ["text/html", "application/xml"])
def test_unknown_paths_are_a_json_404(client, debug, method, path, accept):
    response = getattr(client, method)(path, HTTP_ACCEPT=accept)
    assert_json_error(response, 404, "not_found")


@pytest.mark.parametrize(
    "method, path",
    [
        ("delete", "/api/v1/jobs"),
        ("put", "/api/v1/auth/login"),
        ("post", "/health/ready"),
        ("delete", "/health/live"),
        ("put", "/api/schema/"),
    ],
)
@pytest.mark.parametrize("accept", ["text/html", "application/xml"])
def test_a_wrong_method_is_a_json_405(client, debug, tenant, method, path, accept):
    member = UserFactory(tenant=tenant)
    response = getattr(client, method)(path, HTTP_ACCEPT=accept, HTTP_AUTHORIZATION=bearer(member))
    assert_json_error(response, 405, "method_not_allowed")


@pytest.mark.parametrize("path", ["/api/t/crash", "/health/t/crash", "/api/t/crash-in-render"])
@pytest.mark.parametrize("accept", ["text/html", "*/*"])
def test_a_bug_under_an_api_path_is_a_json_500_without_the_debug_page(
    client, debug, settings, path, accept
):
    for name, value in SECRET_URLS.items():
        setattr(settings, name, value)
    response = client.get(path, HTTP_ACCEPT=accept)
    error = assert_json_error(response, 500, "internal_error")
    assert error["details"] == {}
    for secret in SECRETS:
        assert secret not in response.content.decode()


def test_the_schema_is_served_as_json_when_the_client_asks_for_what_it_has_not(client, debug):
    response = client.get("/api/schema/", HTTP_ACCEPT="application/xml")
    assert response.status_code == 200
    assert response.json()["info"]["title"] == "Hub DomMed API"
    # And YAML, its default, when asked for nothing in particular.
    assert client.get("/api/schema/").content.startswith(b"openapi:")


def test_the_debug_page_of_other_paths_prints_no_url_or_credential(client, settings):
    settings.DEBUG = True
    for name, value in SECRET_URLS.items():
        setattr(settings, name, value)
    response = client.get(
        "/t/plain-crash",
        HTTP_ACCEPT="text/html",
        HTTP_AUTHORIZATION="Bearer header-secret-token",
        # What a WSGI server puts in the request's environment from the process's own.
        DATABASE_URL="postgres://app:db-secret-pw@db.internal:5432/hub",
        AMQP_URL="amqp://guest:env-secret-pw@broker.internal:5672/%2F",
    )
    assert response.status_code == 500
    page = response.content.decode()
    assert "Traceback" in page or "traceback" in page  # it is the debug page
    for secret in (*SECRETS, "header-secret-token", "db-secret-pw", "env-secret-pw"):
        assert secret not in page, secret


def test_the_api_plumbing_may_be_the_first_to_import_drf():
    # A middleware importing common.api is the first to import DRF's views, which read the
    # negotiation class while defining APIView: that class must not live in common.api.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "hubdommed.settings"}
    code = "import django; django.setup(); import common.api, common.middleware"
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr[-2000:]
