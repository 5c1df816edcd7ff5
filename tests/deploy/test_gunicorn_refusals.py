"""What gunicorn refuses before Django sees a request (a request line or headers past its
limits, a request it cannot parse) is JSON in the one error format, as everything under
``/api/`` is: real gunicorn, as ``gunicorn.conf.py`` configures it."""

from __future__ import annotations

import json
import socket

import pytest
import requests

from common.api import error_body
from tests.deploy.servers import gunicorn

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from django.conf import settings

    with gunicorn(settings, tmp_path_factory.mktemp("gunicorn")) as server:
        yield server


def assert_refusal(response: requests.Response, status: int, code: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["Content-Type"] == "application/json"
    body = response.json()
    assert body == error_body(code, body["error"]["message"])
    assert body["error"]["message"]


def test_a_request_line_too_long_is_a_json_414(server):
    response = requests.get(f"{server.url}/api/v1/jobs?q={'x' * 5000}", timeout=10)
    assert_refusal(response, 414, "uri_too_long")


def test_a_header_too_large_is_a_json_431(server):
    response = requests.get(f"{server.url}/api/v1/jobs", headers={"X-Big": "x" * 9000}, timeout=10)
    assert_refusal(response, 431, "headers_too_large")


def test_too_many_headers_is_a_json_431(server):
    headers = {f"X-Header-{n}": "x" for n in range(120)}
    response = requests.get(f"{server.url}/api/v1/jobs", headers=headers, timeout=10)
    assert_refusal(response, 431, "headers_too_large")


def test_a_request_gunicorn_cannot_parse_is_a_json_400(server):
    host, port = server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(b"GET /api/v1/jobs HTTP/9.9\r\nHost: x\r\n\r\n")
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 "), answer
    assert b"Content-Type: application/json" in head
    assert json.loads(body)["error"]["code"] == "malformed_request"


def test_requests_within_the_limits_still_reach_the_api(server):
    response = requests.get(f"{server.url}/api/v1/jobs", headers={"X-Some": "x" * 4000}, timeout=10)
    assert_refusal(response, 401, "not_authenticated")
