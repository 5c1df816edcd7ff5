"""A request's log lines: its correlation id (``X-Request-ID``), its tenant once known, and
one line per request with method, route, status and duration."""

from __future__ import annotations

import logging
import uuid

import pytest
from django.test import Client

from common.context import bind_log_ids, current_log_ids, log_context
from tests.factories import bearer
from tests.observability.conftest import LogLines

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


def request_lines(lines, path: str) -> list[dict]:
    return [
        line for line in lines.json() if line["logger"] == "hubdommed.http" and line["path"] == path
    ]


def test_the_request_id_given_is_returned_and_on_the_requests_log_line(client, json_lines):
    response = client.get("/api/v1/jobs/12", HTTP_X_REQUEST_ID="req-7f3a.b:9_Z")

    assert response["X-Request-ID"] == "req-7f3a.b:9_Z"
    (line,) = request_lines(json_lines, "/api/v1/jobs/12")
    assert line["correlation_id"] == "req-7f3a.b:9_Z"
    assert line["level"] == "INFO"
    assert line["method"] == "GET"
    assert line["route"] == "api/v1/jobs/<int:job_id>"
    assert line["status"] == 401
    assert line["duration_seconds"] >= 0
    # Every line of the request carries it, Django's own warning included.
    others = [
        x
        for x in json_lines.json()
        if x["logger"] == "django.request" and "jobs/12" in x["message"]
    ]
    assert others and all(x["correlation_id"] == "req-7f3a.b:9_Z" for x in others)


@pytest.mark.parametrize(
    "bad",
    [
        "x" * 65,  # too long
        "has spaces in it",
        "new\\nline",
        'quote"d',
        "",  # empty: none given
    ],
)
def test_a_request_id_that_is_not_short_and_plain_is_replaced_by_a_new_one(client, json_lines, bad):
    response = client.get("/health/live", HTTP_X_REQUEST_ID=bad)

    returned = response["X-Request-ID"]
    assert returned != bad
    assert uuid.UUID(returned)
    (line,) = request_lines(json_lines, "/health/live")
    assert line["correlation_id"] == returned
    assert bad not in json_lines.text or not bad


def test_each_request_gets_its_own_id_when_none_is_given(client):
    first = client.get("/health/live")["X-Request-ID"]
    second = client.get("/health/live")["X-Request-ID"]

    assert first != second


def test_lines_after_authentication_carry_the_tenant(client, user, json_lines):
    response = client.get(
        "/api/v1/jobs", HTTP_AUTHORIZATION=bearer(user), HTTP_X_REQUEST_ID="tenant-check"
    )

    assert response.status_code == 200
    (line,) = request_lines(json_lines, "/api/v1/jobs")
    assert line["tenant_id"] == str(user.tenant_id)
    assert line["correlation_id"] == "tenant-check"


def test_a_platform_admin_has_no_tenant_on_the_line(client, platform_admin, json_lines):
    client.get("/api/v1/tenants", HTTP_AUTHORIZATION=bearer(platform_admin))

    (line,) = request_lines(json_lines, "/api/v1/tenants")
    assert "tenant_id" not in line


def test_nothing_of_a_request_stays_bound_after_it(client, user, json_lines):
    client.get("/api/v1/jobs", HTTP_AUTHORIZATION=bearer(user), HTTP_X_REQUEST_ID="gone-after")

    logging.getLogger("hubdommed.test").info("after the request")

    after = [x for x in json_lines.json() if x["message"] == "after the request"]
    assert after and "tenant_id" not in after[0]
    assert after[0].get("correlation_id") != "gone-after"


def test_probes_are_logged_at_debug_only(client, json_lines):
    client.get("/health/live")
    client.get("/metrics")

    for path in ("/health/live", "/metrics"):
        (line,) = request_lines(json_lines, path)
        assert line["level"] == "DEBUG"


# --- the log filter and formats -------------------------------------------------------------


def test_ids_bound_by_log_context_are_on_each_json_line_and_unknown_ones_left_out():
    lines = LogLines("json")
    logger = logging.getLogger("hubdommed.test.json")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        with log_context(correlation_id="c-1", run_id="r-1"):
            logger.info("inside", extra={"task": "job.power_on"})
            with log_context(job_id=42):
                bind_log_ids(tenant_id=7)
                logger.info("deeper")
            logger.info("back out")
        logger.info("outside")
    finally:
        logger.removeHandler(lines.handler)

    inside, deeper, back, outside = lines.json()
    assert inside["message"] == "inside" and inside["task"] == "job.power_on"
    assert inside["correlation_id"] == "c-1" and inside["run_id"] == "r-1"
    assert "job_id" not in inside and "tenant_id" not in inside  # not null: absent
    assert deeper["job_id"] == "42" and deeper["tenant_id"] == "7" and deeper["run_id"] == "r-1"
    # What was bound inside a block ends with it.
    assert "job_id" not in back and "tenant_id" not in back and back["run_id"] == "r-1"
    assert "run_id" not in outside and outside.get("correlation_id") != "c-1"
    assert {"time", "level", "logger", "message"} <= set(inside)
    assert inside["level"] == "INFO" and inside["logger"] == "hubdommed.test.json"
    assert current_log_ids() == {}


def test_an_id_passed_with_the_record_wins_over_the_bound_one():
    lines = LogLines("json")
    logger = logging.getLogger("hubdommed.test.extra")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        with log_context(correlation_id="bound", run_id="bound-run"):
            logger.info("row", extra={"correlation_id": "the-row's", "run_id": "row-run"})
    finally:
        logger.removeHandler(lines.handler)

    (line,) = lines.json()
    assert line["correlation_id"] == "the-row's" and line["run_id"] == "row-run"


def test_the_text_format_prints_the_ids_at_the_end_of_the_line():
    lines = LogLines("text")
    logger = logging.getLogger("hubdommed.test.text")
    logger.addHandler(lines.handler)
    logger.setLevel(logging.INFO)
    try:
        with log_context(correlation_id="c-9", job_id=5):
            logger.info("hello")
    finally:
        logger.removeHandler(lines.handler)

    assert lines.text.rstrip().endswith("hubdommed.test.text hello [correlation_id=c-9 job_id=5]")


def test_unknown_ids_are_refused():
    with pytest.raises(TypeError), log_context(job=1):
        pass
    with log_context(), pytest.raises(TypeError):
        bind_log_ids(tenant=1)
