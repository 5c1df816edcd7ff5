"""The bounds of following a job's output live: how many streams a tenant and a process
hold, a client that reads nothing, and a stream that outlives its reader's right to it.

Each runs the stream process (uvicorn, ``hubdommed.asgi``) as a real process.
"""

from __future__ import annotations

import socket
import time
from datetime import timedelta

import pytest
import requests
from django.conf import settings as django_settings
from django.utils import timezone

from identity.services import tenant_deactivate, user_deactivate
from identity.tokens import issue_access_token
from tests.factories import ManagerFactory, PlatformAdminFactory, UserFactory
from tests.job import test_output_follow
from tests.job.test_output_follow import STREAM, append, headers_of, running_job
from tests.polling import wait_until
from tests.ports import HOST

pytestmark = pytest.mark.django_db(transaction=True)

# The stream processes of the test, stopped at its end.
streams = test_output_follow.streams


class Stream:
    """A stream held open, its first field read: the server is following it."""

    def __init__(self, server, job, headers) -> None:
        self.response = requests.get(
            f"{server.url}{STREAM.format(id=job.pk)}",
            headers=headers,
            stream=True,
            timeout=(5, 30),
        )
        self.status_code = self.response.status_code
        # One iterator for the stream's life: a partly read one, once dropped, closes
        # the connection.
        self.chunks = self.response.iter_content(chunk_size=None)
        self.body = b""
        if self.status_code == 200:
            while b"retry: 1000\n\n" not in self.body:
                self.body += next(self.chunks)

    def read_to_the_end(self, *, within: float = 60) -> bytes:
        """Everything the stream sends until the server closes it; a stream still open
        after ``within`` seconds fails the test (its keep-alive comments wake this loop)."""
        gives_up_at = time.monotonic() + within
        for chunk in self.chunks:
            self.body += chunk
            assert time.monotonic() < gives_up_at, f"still open: {self.body[-300:]!r}"
        return self.body

    def close(self) -> None:
        self.response.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def status_of_one_more(server, job, headers) -> int:
    with Stream(server, job, headers) as stream:
        return stream.status_code


def test_streams_are_bounded_per_tenant_and_per_process_and_given_back_on_disconnect(streams, user):
    server = streams(JOB_OUTPUT_FOLLOW_MAX_PER_TENANT="2", JOB_OUTPUT_FOLLOW_MAX_STREAMS="3")
    job = running_job(user.tenant)
    other = UserFactory()
    other_job = running_job(other.tenant)

    held = [Stream(server, job, headers_of(user)) for _ in range(2)]
    assert [stream.status_code for stream in held] == [200, 200]
    with Stream(server, job, headers_of(user)) as refused:
        assert refused.status_code == 429
        assert refused.response.headers["Content-Type"] == "application/json"
        assert int(refused.response.headers["Retry-After"]) >= 1
        assert refused.response.json()["error"]["code"] == "throttled"
    # Another tenant is not held back by the first one's streams, only by the process's.
    other_held = Stream(server, other_job, headers_of(other))
    assert other_held.status_code == 200
    assert status_of_one_more(server, other_job, headers_of(other)) == 429

    # A client that goes away gives its stream back.
    for stream in held:
        stream.close()
    wait_until(
        lambda: status_of_one_more(server, job, headers_of(user)) == 200,
        timeout=30,
        message=server.log_text,
    )
    other_held.close()


def test_a_client_that_reads_nothing_is_let_go(streams, user, settings):
    # More output than the kernel's buffers between the two ends hold: the server's
    # writes stop, and the stream waits on a client that never reads.
    settings.JOB_OUTPUT_MAX_CHARS = 20_000_000
    server = streams(JOB_OUTPUT_FOLLOW_STALL_SECONDS="1")
    job = running_job(user.tenant)
    piece = "x" * django_settings.JOB_OUTPUT_CHUNK_MAX_CHARS
    for seq in range(12_000_000 // len(piece)):
        append(job, seq, piece)

    conn = socket.socket()
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    conn.settimeout(30)
    conn.connect((HOST, server.port))
    try:
        token = headers_of(user)["Authorization"]
        conn.sendall(
            f"GET {STREAM.format(id=job.pk)} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: {token}\r\n\r\n".encode()
        )
        wait_until(lambda: "read nothing" in server.log_text(), timeout=60, message=server.log_text)
        # The server closed it: what it had sent drains, then the connection ends.
        received = 0
        while chunk := conn.recv(1 << 20):
            received += len(chunk)
    finally:
        conn.close()
    assert 0 < received < 12_000_000


def test_a_stream_ends_when_its_access_token_expires(streams, user):
    server = streams(JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS="0.5")
    job = running_job(user.tenant)
    lifetime = django_settings.ACCESS_TOKEN_LIFETIME
    # Time left for the stream to open on a loaded machine, not so much that the test waits.
    token = issue_access_token(user, issued_at=timezone.now() - lifetime + timedelta(seconds=10))

    with Stream(server, job, {"Authorization": f"Bearer {token.token}"}) as stream:
        assert stream.status_code == 200
        append(job, 0, "still running\n")
        body = stream.read_to_the_end()

    assert b"still running" in body
    assert b"event: end" not in body
    again = requests.get(
        f"{server.url}{STREAM.format(id=job.pk)}",
        headers={"Authorization": f"Bearer {token.token}"},
        timeout=30,
    )
    assert again.status_code == 401
    assert again.json()["error"]["code"] == "token_expired"


@pytest.mark.parametrize("who", ["user", "tenant"])
def test_a_stream_ends_soon_after_its_reader_or_their_tenant_is_deactivated(streams, user, who):
    server = streams(JOB_OUTPUT_FOLLOW_KEEPALIVE_SECONDS="0.5")
    job = running_job(user.tenant)
    manager = ManagerFactory(tenant=user.tenant)

    with Stream(server, job, headers_of(user)) as stream:
        assert stream.status_code == 200
        if who == "user":
            user_deactivate(user=user, actor=manager)
        else:
            tenant_deactivate(tenant=user.tenant, actor=PlatformAdminFactory())
        body = stream.read_to_the_end()

    assert b"event: end" not in body
    assert status_of_one_more(server, job, headers_of(user)) == 401
