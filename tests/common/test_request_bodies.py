"""A request body the API cannot read whole is refused in the one error format, never read
as empty: a body sent without its length (chunked), and a form body (the API reads JSON).
And the API's roots without their slash are the API's 404, not a redirect or a 500."""

from __future__ import annotations

import json
import uuid

import pytest
from django.test import Client

from job.models import Job
from sector.models import Sector
from tests.factories import (
    AutomationWithWorkerFactory,
    JobFactory,
    PlatformAdminFactory,
    SectorFactory,
    UserFactory,
    bearer,
)

pytestmark = pytest.mark.django_db


@pytest.fixture(params=[True, False], ids=["debug", "no-debug"])
def debug(request, settings):
    settings.DEBUG = request.param
    return request.param


def client() -> Client:
    return Client(raise_request_exception=False, enforce_csrf_checks=True)


def assert_error(response, status: int, code: str) -> None:
    assert response.status_code == status, response.content[:300]
    assert response["Content-Type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"error"} and body["error"]["code"] == code, body


def chunked(method: str, path: str, body: dict, **headers):
    """As a server hands Django a chunked request: a Transfer-Encoding, no Content-Length."""
    return client().generic(
        method,
        path,
        json.dumps(body),
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="chunked",
        CONTENT_LENGTH="",
        **headers,
    )


def test_a_body_sent_without_its_length_is_refused_not_read_as_empty(debug):
    admin = PlatformAdminFactory()
    sector = SectorFactory(description="before")

    response = chunked(
        "PATCH",
        f"/api/v1/sectors/{sector.pk}",
        {"description": "after"},
        HTTP_AUTHORIZATION=bearer(admin),
    )

    assert_error(response, 411, "length_required")
    assert Sector.objects.get(pk=sector.pk).description == "before"


@pytest.mark.parametrize("method", ["POST", "PUT", "PATCH"])
def test_every_method_with_a_body_is_refused_without_its_length(method):
    response = chunked(method, "/api/v1/auth/login", {"email": "a@b.c", "password": "x"})

    assert_error(response, 411, "length_required")


def test_a_body_with_its_length_is_read_whatever_its_transfer_encoding_header():
    # A proxy may pass the header on with the length it worked out: the length decides.
    response = client().generic(
        "POST",
        "/api/v1/auth/login",
        json.dumps({"email": "nobody@example.com", "password": "wrong password"}),
        content_type="application/json",
        HTTP_TRANSFER_ENCODING="identity",
    )

    assert_error(response, 401, "invalid_credentials")


def form_bodies(fields: dict[str, str]) -> list[tuple[str, bytes]]:
    multipart = b"".join(
        f'--x\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
        for name, value in fields.items()
    )
    urlencoded = "&".join(f"{name}={value}" for name, value in fields.items()).encode()
    return [
        ("multipart/form-data; boundary=x", multipart + b"--x--\r\n"),
        ("application/x-www-form-urlencoded", urlencoded),
    ]


@pytest.mark.parametrize("kind", [0, 1], ids=["multipart", "urlencoded"])
def test_a_form_body_is_refused_as_415_not_read_as_empty(kind):
    # A worker's claim sent as a form: before, its token was lost and the hub picked one.
    automation = AutomationWithWorkerFactory()
    job = JobFactory(automation=automation, tenant=UserFactory().tenant)
    token = str(uuid.uuid4())
    content_type, body = form_bodies({"claim_token": token})[kind]

    response = client().generic(
        "POST",
        f"/api/v1/jobs/{job.pk}/start",
        body,
        content_type=content_type,
        HTTP_AUTHORIZATION=f"Bearer {automation.credential}",
    )

    assert_error(response, 415, "unsupported_media_type")
    assert Job.objects.get(pk=job.pk).status == "pending"


@pytest.mark.parametrize("kind", [0, 1], ids=["multipart", "urlencoded"])
def test_a_login_sent_as_a_form_is_refused_as_415(kind):
    user = UserFactory()
    content_type, body = form_bodies({"email": user.email, "password": "whatever"})[kind]

    response = client().generic("POST", "/api/v1/auth/login", body, content_type=content_type)

    assert_error(response, 415, "unsupported_media_type")


@pytest.mark.parametrize("path", ["/api", "/health"])
@pytest.mark.parametrize("method", ["get", "post", "put", "patch", "delete"])
def test_the_roots_without_their_slash_are_a_json_404(debug, path, method):
    response = getattr(client(), method)(path, HTTP_ACCEPT="text/html")

    assert_error(response, 404, "not_found")
