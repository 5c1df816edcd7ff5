"""An answer from the hub that is not what the worker API answers (a 2xx cut short to
nothing, a proxy's page, a list where a job was due) is a failed call the worker tries
again, never an exception that ends its loop.

The hub here is a real HTTP server on loopback that answers every request with the same
status and body."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from automation.agent.client import HubClient, HubError
from automation.agent.worker import AutomationWorker
from tests.machines.test_idle_exit import automation

# Bodies the worker API never answers with a 2xx, and a proxy or a cut connection may.
NOTHING, NULL, NUMBER, LIST, OBJECT = b"", b"null", b"42", b"[]", b"{}"


class OddHub(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, body: bytes) -> None:
        self.body = body
        self.requests = 0
        super().__init__(("127.0.0.1", 0), _Answer)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Answer(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        self.server.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    do_GET = do_POST = _answer

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def odd_hub(request) -> Iterator[OddHub]:
    hub = OddHub(request.param)
    # Its shutdown waits for the loop's next look: a short one.
    thread = threading.Thread(target=hub.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield hub
    hub.shutdown()
    hub.server_close()


# Each call of the worker's client, and the answers it must not take: anything but a JSON
# object (a list for the poll), and an object without what it must hold.
CALLS = {
    "me": (lambda client: client.me(), [NOTHING, NULL, NUMBER, LIST, OBJECT]),
    "pending_jobs": (lambda client: client.pending_jobs(), [NOTHING, NULL, NUMBER, OBJECT]),
    "claim": (lambda client: client.claim(7), [NOTHING, NULL, NUMBER, LIST, OBJECT]),
    "heartbeat": (lambda client: client.heartbeat(7, "token"), [NOTHING, NULL, NUMBER, LIST]),
    "output": (
        lambda client: client.output(7, "token", seq=1, text="line\n"),
        [NOTHING, NULL, NUMBER, LIST],
    ),
    "complete": (lambda client: client.complete(7, "token", result={}), [NOTHING, NULL, LIST]),
    "fail": (lambda client: client.fail(7, "token", error="boom"), [NOTHING, NULL, LIST]),
}
CASES = [
    pytest.param(call, body, id=f"{call}-{body.decode() or 'nothing'}")
    for call, (_, bodies) in CALLS.items()
    for body in bodies
]


@pytest.mark.parametrize(("call", "odd_hub"), CASES, indirect=["odd_hub"])
def test_an_answer_of_the_wrong_shape_is_a_hub_error_to_try_again(odd_hub, call):
    client = HubClient(odd_hub.url, "credential")
    try:
        with pytest.raises(HubError) as raised:
            CALLS[call][0](client)
    finally:
        client.close()
    assert raised.value.retryable, raised.value
    assert raised.value.status is None


@pytest.mark.parametrize(
    "odd_hub", [NOTHING, NULL, NUMBER], ids=["nothing", "null", "42"], indirect=True
)
def test_a_poll_answered_with_nothing_is_tried_again_and_the_worker_goes_on(odd_hub):
    client = HubClient(odd_hub.url, "credential")
    worker = AutomationWorker(client, automation(), poll_interval=0.05, idle_timeout=0.5)
    try:
        stats = worker.run(release_machine=lambda: None)
    finally:
        client.close()
    # It polled again after the odd answer (at least once more, going idle), and ended as
    # an idle worker does.
    assert odd_hub.requests >= 2
    assert not stats.errors
