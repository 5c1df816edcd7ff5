"""A body sent in chunks, without its length, through the real servers (gunicorn for the
API, uvicorn for the stream process): refused with a 411 in the error format. Django reads
a body by its Content-Length alone, so without this the view saw an empty body."""

from __future__ import annotations

import json

import pytest

from tests.servers import api_server, exchange, stop_all, stream_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, django_db_setup, django_db_blocker):
    from django.conf import settings

    logs = tmp_path_factory.mktemp("servers")
    started = [api_server(settings, logs).start(), stream_server(settings, logs).start()]
    yield started
    stop_all(*started)


def send_chunked(server, path: str, body: bytes) -> tuple[bytes, bytes]:
    request = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    ).encode() + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    return exchange(server, request)


@pytest.mark.parametrize("which", [0, 1], ids=["gunicorn", "uvicorn"])
def test_a_chunked_body_is_refused_with_a_json_411(servers, which):
    body = json.dumps({"email": "nobody@example.com", "password": "wrong"}).encode()

    head, rest = send_chunked(servers[which], "/api/v1/auth/login", body)

    assert head.startswith(b"HTTP/1.1 411 "), head + rest[:300]
    assert b"application/json" in head.lower()
    if b"transfer-encoding: chunked" in head.lower():
        rest = rest.split(b"\r\n", 1)[1].rsplit(b"\r\n0\r\n", 1)[0]
    assert json.loads(rest)["error"]["code"] == "length_required"
