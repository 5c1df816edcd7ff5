"""A real HTTP receiver on loopback, and settings that let deliveries reach it."""

from __future__ import annotations

import contextlib
import queue
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import trustme

from outbox.models import OutboxMessage
from tests.factories import ManagerFactory
from webhook.services import endpoint_create


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    # The status the receiver answered it with (sent late, or never, for a slow reply).
    answered: int = 0
    # The client's port: requests over one kept connection share it.
    client_port: int = 0


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"ok"
    headers: dict[str, str] = field(default_factory=dict)
    # Seconds to wait before answering (a receiver slower than the read timeout).
    delay: float = 0.0


class Receiver:
    """Answers each request with the next scripted reply (then ``default``), and keeps
    what it received."""

    def __init__(self) -> None:
        self.replies: queue.SimpleQueue[Reply] = queue.SimpleQueue()
        self.default = Reply()
        self.received: list[Received] = []
        self.lock = threading.Lock()
        # Set to make every waiting handler answer at once (the end of a test).
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            # The answer's head and body go out at once (no wait for a delayed ACK).
            disable_nagle_algorithm = True
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length)
                try:
                    reply = receiver.replies.get_nowait()
                except queue.Empty:
                    reply = receiver.default
                headers = {k.lower(): v for k, v in self.headers.items()}
                with receiver.lock:
                    receiver.received.append(
                        Received(self.path, headers, body, reply.status, self.client_address[1])
                    )
                if reply.delay:
                    receiver.release.wait(reply.delay)
                try:
                    self.send_response(reply.status)
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", str(len(reply.body)))
                    self.end_headers()
                    self.wfile.write(reply.body)
                except OSError:
                    pass  # the client gave up (a timeout): nothing to answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        # A short poll: shutdown() at the end of each test returns at once.
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def script(self, *replies: Reply) -> None:
        for reply in replies:
            self.replies.put(reply)

    def requests(self) -> list[Received]:
        with self.lock:
            return list(self.received)


@pytest.fixture
def receiver():
    server = Receiver()
    server.thread.start()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture(autouse=True)
def kept_connections():
    """Each test starts with no connection kept from another test's receivers."""
    from webhook import transport

    transport.pools.close()
    yield transport.pools
    transport.pools.close()


@pytest.fixture(autouse=True)
def webhook_settings(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_CONNECT_TIMEOUT = 1.0
    settings.WEBHOOK_READ_TIMEOUT = 0.5
    settings.WEBHOOK_TIMEOUT = 2.0
    settings.WEBHOOK_RETRY_DELAYS = [1.0, 2.0, 4.0]
    return settings


@pytest.fixture
def manager(tenant):
    return ManagerFactory(tenant=tenant)


@pytest.fixture
def make_endpoint(tenant, manager):
    def make(url: str, event_types=("JobCompleted", "JobFailed"), **kwargs):
        return endpoint_create(
            tenant=kwargs.pop("tenant", tenant),
            url=url,
            event_types=list(event_types),
            actor=kwargs.pop("actor", manager),
            **kwargs,
        )

    return make


def due_deliver_runs() -> list[OutboxMessage]:
    """The webhook.deliver rows of the outbox not sent yet, oldest first."""
    return list(
        OutboxMessage.objects.filter(
            envelope__task="webhook.deliver", sent_at__isnull=True
        ).order_by("id")
    )


def elapsed(since: float) -> float:
    return time.monotonic() - since


def run_attempt(row: OutboxMessage) -> list[str]:
    """Do what the worker does with a webhook.deliver message: call its handler. What each
    delivery the run took came to, in the order it took them."""
    import uuid

    from outbox.handlers import TaskMessage
    from webhook.tasks import deliver

    envelope = row.envelope
    return deliver(
        TaskMessage(
            run_id=uuid.UUID(envelope["run_id"]),
            task=envelope["task"],
            payload=envelope["payload"],
            tenant=envelope["tenant"],
            receive_count=1,
            envelope=envelope,
        )
    )


def run_due_attempts() -> int:
    """Run every webhook.deliver row not sent yet (due or not: the tests skip the wait) and
    mark it sent, as the relay would. Returns how many deliveries the runs took (a run
    takes every delivery scheduled on it)."""
    from django.utils import timezone

    rows = due_deliver_runs()
    taken = 0
    for row in rows:
        OutboxMessage.objects.filter(pk=row.pk).update(sent_at=timezone.now())
        taken += len(run_attempt(row))
    return taken


@dataclass
class TLSReceiver:
    port: int
    # The certificate authority that issued the receiver's certificate, as a PEM file.
    ca_file: str
    received: list[dict[str, str]]
    # The name each client asked for in SNI.
    server_names: list[str | None]


@contextlib.contextmanager
def tls_receiver(certificate_name: str) -> Iterator[TLSReceiver]:
    """A TLS receiver on loopback whose certificate is issued for ``certificate_name``;
    it answers each POST 204 and keeps its headers."""
    ca = trustme.CA()
    cert = ca.issue_cert(certificate_name)
    received: list[dict[str, str]] = []
    server_names: list[str | None] = []

    class Handler(BaseHTTPRequestHandler):
        # The answer's head and body go out at once (no wait for a delayed ACK).
        disable_nagle_algorithm = True
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            received.append({k.lower(): v for k, v in self.headers.items()})
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(context)
    context.sni_callback = lambda _socket, name, _context: server_names.append(name)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with ca.cert_pem.tempfile() as ca_file:
            yield TLSReceiver(server.server_address[1], ca_file, received, server_names)
    finally:
        server.shutdown()
        server.server_close()


class RawReceiver:
    """A receiver that answers each request it reads with the next of ``answers``, bytes
    written as they are (HTTP or not), then closes the connection. What no well-behaved
    server sends: informational answers, malformed heads, other protocols' greetings."""

    def __init__(self, *answers: bytes) -> None:
        self.answers = list(answers)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        # The request lines read, one a request.
        self.requests: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.listener.accept()
                with client:
                    client.settimeout(10)
                    self.requests.append(read_request(client))
                    client.sendall(self.answers.pop(0) if self.answers else b"")

    def close(self) -> None:
        self.listener.close()


def read_request(client: socket.socket) -> bytes:
    """Read one request (its head and its Content-Length of body); its request line."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = client.recv(65536)
        if not chunk:
            return b""
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in lines
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        body += client.recv(65536)
    return lines[0]


@pytest.fixture
def raw_receiver():
    made: list[RawReceiver] = []

    def make(*answers: bytes) -> RawReceiver:
        made.append(RawReceiver(*answers))
        return made[-1]

    yield make
    for server in made:
        server.close()
