"""A local AWS endpoint (moto's server on loopback) for the tests that need SQS or EC2.

Started once per test session, on a free port; nothing reaches the internet.
"""

from __future__ import annotations

import os
import uuid

import pytest

from tests.ports import free_port

_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


@pytest.fixture(scope="session")
def moto_endpoint():
    """The endpoint URL of a moto server; boto3 gets throwaway credentials for it."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in _FAKE_CREDENTIALS}
    os.environ.update(_FAKE_CREDENTIALS)
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class PrivateMoto:
    """A moto server of a test's own on loopback, to stop and start again on one port:
    the endpoint going away and coming back. Its queues live in the process (moto's
    backends), so they are there again after a restart, as SQS's are after an outage.
    Needs the credentials ``moto_endpoint`` sets."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = None

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
        self._server.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None


@pytest.fixture
def private_sqs(settings, moto_endpoint):
    """The settings' SQS endpoint is a ``PrivateMoto`` of this test's own (returned, for
    the test to stop and start), its queues under a prefix of their own: moto's queues
    live in the process, shared with the session's server."""
    # moto_endpoint: the session's server, for its throwaway credentials.
    server = PrivateMoto()
    server.start()
    settings.BROKER = "sqs"
    settings.SQS_ENDPOINT_URL = server.url
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{uuid.uuid4().hex[:6]}-"
    yield server
    server.stop()
