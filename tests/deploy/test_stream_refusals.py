"""What the stream process (uvicorn) refuses before the application sees it (a request it
cannot parse) is JSON in the one error format, as gunicorn's refusals are: the process as
the Procfile starts it."""

from __future__ import annotations

import json

import pytest

from tests.servers import exchange, stream_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def server(tmp_path_factory, django_db_setup, django_db_blocker):
    from django.conf import settings

    started = stream_server(settings, tmp_path_factory.mktemp("stream")).start()
    yield started
    started.stop()


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /api/v1/me HTTP/1.1\r\nHost: x\r\nX-Odd: a\x00b\r\n\r\n",
        b"GET /api/v1/\xff HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /api/v1/me HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    ],
    ids=["nul-in-header", "byte-in-path", "bad-length"],
)
def test_a_request_uvicorn_cannot_parse_is_a_json_400(server, request_bytes):
    head, body = exchange(server, request_bytes)

    assert head.startswith(b"HTTP/1.1 400 "), head + body
    assert b"content-type: application/json" in head.lower()
    assert json.loads(body)["error"]["code"] == "malformed_request"
