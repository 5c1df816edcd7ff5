"""A request's time limit is wall-clock: a receiver that answers a byte now and then, each
within the read timeout, still has the request end at ``WEBHOOK_TIMEOUT``."""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time

import pytest
import trustme

from tests.webhook.test_safety import fake_dns
from webhook import transport

# Each byte comes well within the read timeout (0.5 s in these tests).
DRIP_SECONDS = 0.1
TIMEOUT = 1.0
# The request's thread is given this long before the test calls it hung.
HUNG_AFTER = 15.0

STATUS_LINE = b"HTTP/1.1 200 OK\r\n"
HEADERS = STATUS_LINE + b"Content-Type: text/plain\r\nContent-Length: 100000\r\n\r\n"


class DrippingReceiver:
    """Reads a request, writes ``head`` at once, then one byte every ``DRIP_SECONDS``
    until the hub lets go of the connection."""

    def __init__(self, head: bytes, drip: bytes, tls: ssl.SSLContext | None = None) -> None:
        self.head, self.drip, self.tls = head, drip, tls
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        # When the hub closed the connection, by the receiver's clock.
        self.let_go_at: float | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            client, _ = self.listener.accept()
            if self.tls is not None:
                client = self.tls.wrap_socket(client, server_side=True)
            with client:
                _read_request(client)
                client.sendall(self.head)
                while not self.stopped.wait(DRIP_SECONDS):
                    client.sendall(self.drip)
        self.let_go_at = time.monotonic()

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


def _read_request(client: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += client.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += client.recv(65536)


@pytest.fixture(autouse=True)
def short_limit(settings):
    settings.WEBHOOK_TIMEOUT = TIMEOUT


def post_in_a_thread(url: str) -> tuple[transport.Answer | None, float]:
    """The answer (None: still waiting after ``HUNG_AFTER``) and the seconds it took."""
    answers: list[transport.Answer] = []
    began = time.monotonic()
    thread = threading.Thread(
        target=lambda: answers.append(transport.post(url, b'{"a": 1}', {})), daemon=True
    )
    thread.start()
    thread.join(HUNG_AFTER)
    return (answers[0] if answers else None), time.monotonic() - began


@pytest.mark.parametrize(
    ("head", "drip"),
    [
        pytest.param(STATUS_LINE + b"X-Slow: ", b"a", id="headers"),
        pytest.param(HEADERS, b"a", id="body"),
    ],
)
def test_a_receiver_dripping_its_answer_is_cut_off_at_the_time_limit(head, drip):
    receiver = DrippingReceiver(head, drip)
    try:
        answer, seconds = post_in_a_thread(receiver.url)
    finally:
        receiver.close()

    assert answer is not None, f"the request was still going after {HUNG_AFTER} s"
    assert seconds < TIMEOUT + 1.0
    assert answer.status_code is None
    assert answer.timed_out
    assert answer.error == f"timeout: the request took longer than {TIMEOUT:g} s"
    # The connection was not kept for a next request: the receiver saw it go.
    deadline = time.monotonic() + 5
    while receiver.let_go_at is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.let_go_at is not None
    assert len(transport.pools) <= 1


def test_a_tls_receiver_dripping_its_answer_is_cut_off_at_the_time_limit(settings, monkeypatch):
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("hooks.example.test").configure_cert(context)
    fake_dns(monkeypatch, {"hooks.example.test": ["127.0.0.1"]})
    receiver = DrippingReceiver(HEADERS, b"a", tls=context)
    try:
        with ca.cert_pem.tempfile() as ca_file:
            settings.WEBHOOK_CA_BUNDLE = ca_file
            answer, seconds = post_in_a_thread(f"https://hooks.example.test:{receiver.port}/h")
    finally:
        receiver.close()

    assert answer is not None, f"the request was still going after {HUNG_AFTER} s"
    assert seconds < TIMEOUT + 1.0
    assert answer.timed_out
    assert answer.error == f"timeout: the request took longer than {TIMEOUT:g} s"


def test_an_answer_within_the_limit_keeps_its_connection(receiver):
    first = transport.post(receiver.url, b"{}", {})
    # Longer than the time limit: a cut-off armed for the first request must not reach the
    # connection the second one reuses.
    time.sleep(TIMEOUT + 0.3)
    second = transport.post(receiver.url, b"{}", {})

    assert (first.status_code, second.status_code) == (200, 200)
    one, two = receiver.requests()
    assert one.client_port == two.client_port
