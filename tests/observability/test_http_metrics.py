"""The API's requests as metrics: by route template (never the path), method and status."""

from __future__ import annotations

import pytest
from django.test import Client

from tests.factories import JobFactory, bearer
from tests.observability.conftest import sample

pytestmark = pytest.mark.django_db

REQUESTS = "hubdommed_http_requests_total"
DURATION_COUNT = "hubdommed_http_request_duration_seconds_count"


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


def test_a_request_is_counted_under_its_route_template_not_its_path(client, user):
    job = JobFactory(tenant=user.tenant, requested_by=user)
    route = "api/v1/jobs/<int:job_id>"
    before = sample(REQUESTS, route=route, method="GET", status="200")
    timed_before = sample(DURATION_COUNT, route=route, method="GET")

    response = client.get(f"/api/v1/jobs/{job.id}", HTTP_AUTHORIZATION=bearer(user))

    assert response.status_code == 200
    assert sample(REQUESTS, route=route, method="GET", status="200") == before + 1
    assert sample(DURATION_COUNT, route=route, method="GET") == timed_before + 1


def test_the_status_is_the_one_the_client_gets(client, user):
    route = "api/v1/jobs/<int:job_id>"
    before_401 = sample(REQUESTS, route=route, method="GET", status="401")
    before_404 = sample(REQUESTS, route=route, method="GET", status="404")

    assert client.get("/api/v1/jobs/1").status_code == 401
    assert client.get("/api/v1/jobs/999999", HTTP_AUTHORIZATION=bearer(user)).status_code == 404

    assert sample(REQUESTS, route=route, method="GET", status="401") == before_401 + 1
    assert sample(REQUESTS, route=route, method="GET", status="404") == before_404 + 1


@pytest.mark.parametrize(
    "path",
    [
        "/no/such/page",  # matched no pattern at all
        "/api/v1/no-such-thing/12345",  # the API's catch-all 404
        "/admin/no-such-model/",  # the admin's catch-all (for a signed-in admin)
    ],
)
def test_paths_that_match_no_route_are_counted_as_unmatched(client, platform_admin, path):
    client.force_login(platform_admin)
    before = sample(REQUESTS, route="unmatched", method="GET", status="404")
    for n in range(3):
        assert client.get(f"{path}{n}").status_code == 404

    # However many different paths a scanner tries, one series.
    assert sample(REQUESTS, route="unmatched", method="GET", status="404") == before + 3
    assert sample(REQUESTS, route=f"{path}0", method="GET", status="404") == 0


def test_a_method_nobody_uses_is_counted_as_other(client):
    before = sample(REQUESTS, route="health/live", method="other", status="405")

    response = client.generic("BREW", "/health/live")

    assert response.status_code == 405
    assert sample(REQUESTS, route="health/live", method="other", status="405") == before + 1
    assert sample(REQUESTS, route="health/live", method="BREW", status="405") == 0


def test_static_files_are_counted_as_static(client):
    before = sample(REQUESTS, route="static", method="GET", status="200")

    response = client.get("/static/admin/css/base.css")

    assert response.status_code == 200
    assert sample(REQUESTS, route="static", method="GET", status="200") == before + 1


@pytest.mark.urls("tests.common.urls")
@pytest.mark.parametrize(
    "path", ["/t/crash", "/api/t/crash", "/t/plain-crash", "/api/t/crash-in-render"]
)
def test_a_request_that_crashes_is_counted_as_the_500_the_client_gets(client, json_lines, path):
    route = path.lstrip("/")
    before = sample(REQUESTS, route=route, method="GET", status="500")

    response = client.get(path, HTTP_X_REQUEST_ID="crash-1")

    assert response.status_code == 500
    assert sample(REQUESTS, route=route, method="GET", status="500") == before + 1
    # The error's own lines carry the request's id too.
    errors = [line for line in json_lines.json() if line["level"] == "ERROR"]
    assert errors and all(line["correlation_id"] == "crash-1" for line in errors)
