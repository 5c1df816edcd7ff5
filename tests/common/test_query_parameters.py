"""What a client puts in a request besides its JSON body: the query string and the charset
its ``Content-Type`` names. A bad value is a 400 (a 415 for a charset) in the one error
format, on every list of the API: never the default read in its place, never a 500."""

from __future__ import annotations

import io
import json
import sys

import pytest
from django.test import Client
from django.urls import reverse

from common.api import error_body
from tests.factories import (
    AutomationWithWorkerFactory,
    ManagerFactory,
    PlatformAdminFactory,
    RunningJobFactory,
    TenantFactory,
    bearer,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    """A tenant with a manager, a running job of an automation, a schedule and a webhook
    endpoint; a platform admin; and the automation's worker credential."""
    tenant = TenantFactory()
    manager = ManagerFactory(tenant=tenant)
    automation = AutomationWithWorkerFactory()
    job = RunningJobFactory(tenant=tenant, automation=automation, requested_by=manager)
    people = Client(HTTP_AUTHORIZATION=bearer(manager))
    endpoint = people.post(
        "/api/v1/webhooks",
        {"url": "https://example.com/hook", "event_types": ["JobCreated"]},
        content_type="application/json",
    )
    assert endpoint.status_code == 201, endpoint.content
    schedule = people.post(
        "/api/v1/schedules",
        {"automation": automation.id, "cron": "0 * * * *"},
        content_type="application/json",
    )
    assert schedule.status_code == 201, schedule.content
    return {
        "manager": people,
        "admin": Client(HTTP_AUTHORIZATION=bearer(PlatformAdminFactory())),
        "worker": Client(HTTP_AUTHORIZATION=f"Bearer {automation.credential}"),
        "job": job.id,
        "endpoint": endpoint.json()["id"],
    }


# Every list of the API, as (who reads it, its path); the paths take the world's ids.
OFFSET_LISTS = [
    ("admin", "/api/v1/tenants"),
    ("manager", "/api/v1/users"),
    ("manager", "/api/v1/sectors"),
    ("manager", "/api/v1/automations"),
    ("manager", "/api/v1/schedules"),
    ("manager", "/api/v1/webhooks"),
]
CURSOR_LISTS = [
    ("manager", "/api/v1/jobs"),
    ("manager", "/api/v1/webhooks/{endpoint}/deliveries"),
    ("manager", "/api/v1/events"),
]
LISTS = OFFSET_LISTS + CURSOR_LISTS
# The other reads that take query parameters.
OTHER_READS = [
    ("manager", "/api/v1/jobs/{job}/output"),
    ("manager", "/api/v1/jobs/{job}/output/stream"),
    ("worker", "/api/v1/worker/jobs"),
]


def get(world, who: str, path: str, query: str):
    return world[who].get(f"{path.format(**world)}?{query}")


def assert_invalid(response, field: str) -> None:
    assert response.status_code == 400, response.content
    body = response.json()
    assert body == error_body("invalid", "The input is invalid.", body["error"]["details"])
    assert list(body["error"]["details"]) == [field], body


@pytest.mark.parametrize(("who", "path"), LISTS)
@pytest.mark.parametrize("limit", ["0", "-1", "201", "abc", "", "1e3", "1" + "0" * 30])
def test_a_page_size_out_of_bounds_is_a_400_on_every_list(world, who, path, limit):
    # Read as the default (50) or cut to 200 before, answered 200.
    assert_invalid(get(world, who, path, f"limit={limit}"), "limit")


@pytest.mark.parametrize(("who", "path"), OFFSET_LISTS)
@pytest.mark.parametrize("offset", ["-1", "abc", "", "1.5"])
def test_an_offset_that_is_no_position_is_a_400(world, who, path, offset):
    # Read as 0 before: the first page, answered 200.
    assert_invalid(get(world, who, path, f"offset={offset}"), "offset")


@pytest.mark.parametrize(("who", "path"), LISTS)
def test_pages_within_bounds_still_page(world, who, path):
    response = get(world, who, path, "limit=1")
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) <= 1
    assert get(world, who, path, "limit=200").status_code == 200


@pytest.mark.parametrize(("who", "path"), OFFSET_LISTS)
def test_an_offset_past_the_end_is_an_empty_page(world, who, path):
    response = get(world, who, path, f"offset={10**30}")
    assert response.status_code == 200, response.content
    assert response.json()["results"] == []


@pytest.mark.parametrize(("who", "path"), LISTS + OTHER_READS)
def test_a_parameter_given_twice_is_a_400(world, who, path):
    # Read as its last value before: the first dropped without a word.
    assert_invalid(get(world, who, path, "limit=1&limit=2"), "limit")


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=running&status=failed", "status"),
        ("automation=1&automation=2", "automation"),
        ("cursor=a&cursor=b", "cursor"),
        ("unknown=1&unknown=2", "unknown"),
    ],
)
def test_a_filter_given_twice_is_refused_not_read_as_its_last_value(world, query, field):
    assert_invalid(get(world, "manager", "/api/v1/jobs", query), field)


def test_a_read_that_takes_no_parameters_is_not_refused_for_them(world):
    # Its schema documents no 400: there is no parameter it reads to refuse.
    assert get(world, "manager", "/api/v1/me", "x=1&x=2").status_code == 200


def test_a_list_of_values_is_one_parameter(world):
    response = get(world, "manager", "/api/v1/jobs", "status=running,failed")
    assert response.status_code == 200, response.content
    assert [job["id"] for job in response.json()["results"]] == [world["job"]]


@pytest.mark.parametrize(
    ("who", "path", "query", "field"),
    [
        ("manager", "/api/v1/jobs", "automation=", "automation"),
        ("manager", "/api/v1/jobs", "status=", "status"),
        ("manager", "/api/v1/jobs", "created_after=", "created_after"),
        ("manager", "/api/v1/automations", "sector=", "sector"),
        ("manager", "/api/v1/schedules", "automation=", "automation"),
        ("admin", "/api/v1/events", "tenant=", "tenant"),
        ("manager", "/api/v1/events", "type=", "type"),
        ("manager", "/api/v1/jobs/{job}/output", "offset=", "offset"),
        ("manager", "/api/v1/jobs/{job}/output/stream", "offset=", "offset"),
        ("worker", "/api/v1/worker/jobs", "limit=", "limit"),
    ],
)
def test_an_empty_filter_is_refused_not_dropped(world, who, path, query, field):
    # Read as no filter before: every row listed, answered 200.
    assert_invalid(get(world, who, path, query), field)


@pytest.mark.parametrize(
    ("who", "path"),
    [("manager", "/api/v1/sectors"), ("manager", "/api/v1/automations")],
)
def test_an_empty_search_still_keeps_every_row(world, who, path):
    assert get(world, who, path, "search=").status_code == 200


@pytest.mark.parametrize("field", ["created_after", "created_before"])
@pytest.mark.parametrize("moment", ["2026-01-01T00:00:00", "2026-01-01", "2026-01-01T00:00"])
def test_a_jobs_time_filter_without_its_offset_is_refused(world, field, moment):
    # Taken as UTC before, where the events' filters refuse it: a time without an offset
    # names no instant.
    response = get(world, "manager", "/api/v1/jobs", f"{field}={moment}")
    assert_invalid(response, field)
    assert "offset" in response.json()["error"]["details"][field][0]


def test_a_jobs_time_filter_with_its_offset_is_taken(world):
    for moment in ("2000-01-01T00:00:00Z", "2000-01-01T01:00:00%2B01:00"):
        response = get(world, "manager", "/api/v1/jobs", f"created_after={moment}")
        assert response.status_code == 200, response.content
        assert [job["id"] for job in response.json()["results"]] == [world["job"]]


def test_the_schema_documents_the_bounds_of_every_list(client):
    schema = json.loads(client.get(reverse("schema"), {"format": "json"}).content)
    for _, path in LISTS:
        operation = schema["paths"][path.replace("{endpoint}", "{endpoint_id}")]["get"]
        parameters = {
            parameter["name"]: parameter["schema"]
            for parameter in operation["parameters"]
            if parameter["in"] == "query"
        }
        assert (parameters["limit"]["minimum"], parameters["limit"]["maximum"]) == (1, 200), path
        if path in dict((p, w) for w, p in OFFSET_LISTS):
            assert parameters["offset"]["minimum"] == 0, path
    jobs = {
        parameter["name"]: parameter
        for parameter in schema["paths"]["/api/v1/jobs"]["get"]["parameters"]
    }
    assert "offset" in jobs["created_after"]["description"]


# --- the charset of Content-Type ----------------------------------------------------------


def wsgi_call(path: str, query: str, content_type: str, body: bytes = b"", method="GET"):
    """One request through the WSGI application gunicorn serves (``hubdommed.wsgi``)."""
    from hubdommed.wsgi import application

    answer = {}

    def start_response(status, headers, exc_info=None):
        answer["status"] = int(status.split()[0])
        answer["headers"] = dict(headers)

    environ = {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "QUERY_STRING": query,
        "CONTENT_TYPE": content_type,
        "CONTENT_LENGTH": str(len(body)),
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.url_scheme": "http",
        "wsgi.version": (1, 0),
        "wsgi.multithread": False,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
    }
    response = application(environ, start_response)
    try:
        content = b"".join(response)
    finally:
        response.close()
    return answer["status"], answer["headers"], content


@pytest.fixture
def hosts(settings):
    settings.ALLOWED_HOSTS = ["testserver"]


@pytest.mark.parametrize("charset", ["zlib", "base64", "rot13", "bz2", "hex"])
@pytest.mark.parametrize(
    ("path", "status"), [("/health/live", 200), ("/api/v1/me", 401), ("/api/v1/jobs", 401)]
)
def test_a_charset_that_is_no_text_encoding_is_no_500(hosts, charset, path, status):
    # The request failed to build (Django decoded ``?x=1`` with the codec): a 500 from
    # every path, before any middleware.
    answer, headers, content = wsgi_call(path, "x=1", f"text/plain; charset={charset}")
    assert answer == status, content
    assert headers["Content-Type"] == "application/json"


def test_a_form_in_a_charset_that_is_no_text_encoding_is_read_as_utf8(hosts):
    status, _, content = wsgi_call(
        "/admin/login/",
        "",
        "application/x-www-form-urlencoded; charset=zlib",
        b"username=a&password=b",
        method="POST",
    )
    assert status == 403, content  # the CSRF check's answer, not a 500


def test_the_stream_process_reads_such_a_charset_as_utf8_too():
    from hubdommed.asgi import _django

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/admin/login/",
        "query_string": b"next=%2Fadmin%2F",
        "headers": [(b"content-type", b"application/x-www-form-urlencoded; charset=zlib")],
    }
    request = _django.request_class(scope, io.BytesIO(b"username=a%C3%A9"))
    assert request.POST["username"] == "aé"
    assert request.GET["next"] == "/admin/"


@pytest.mark.parametrize("charset", ["bogus", "zlib", "base64", "undefined"])
def test_a_body_in_a_charset_that_is_no_text_encoding_is_a_415(world, charset):
    # ``charset=bogus`` was read as UTF-8 (201), ``charset=zlib`` a 400 malformed_request.
    response = world["manager"].generic(
        "POST",
        "/api/v1/jobs",
        b'{"automation": 1}',
        content_type=f"application/json; charset={charset}",
    )
    assert response.status_code == 415, response.content
    assert response.json()["error"]["code"] == "unsupported_media_type"
    assert charset in response.json()["error"]["message"]


@pytest.mark.parametrize("charset", ["utf-8", "UTF-8", "latin-1", None])
def test_a_body_in_a_text_charset_is_read_in_it(world, charset):
    content_type = "application/json" + (f"; charset={charset}" if charset else "")
    body = json.dumps({"full_name": "Zoé"}, ensure_ascii=False).encode(charset or "utf-8")
    response = world["manager"].generic(
        "PATCH",
        "/api/v1/users/{}".format(get(world, "manager", "/api/v1/me", "").json()["id"]),
        body,
        content_type=content_type,
    )
    assert response.status_code == 200, response.content
    assert response.json()["full_name"] == "Zoé"


# --- text that does not decode -----------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("search=%FF", "search"),
        ("search=%ED%A0%80", "search"),
        ("search=ok&se%C3arch=x", "se\\ufffdarch"),
        ("search=%C3%A9&limit=%C0%B1", "limit"),
    ],
)
def test_a_query_parameter_that_is_no_utf8_is_a_400(world, query, field):
    # Read with U+FFFD in place of the bytes before: a search for that character, a 200.
    response = get(world, "manager", "/api/v1/sectors", query)
    assert response.status_code == 400, response.content
    body = response.json()
    assert body["error"]["code"] == "invalid"
    assert list(body["error"]["details"]) == [field]


def test_a_query_parameter_in_utf8_is_read(world):
    response = get(world, "manager", "/api/v1/sectors", "search=%C3%A9t%C3%A9+x")
    assert response.status_code == 200, response.content
