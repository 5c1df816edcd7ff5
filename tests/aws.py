"""A local AWS endpoint (moto's server on loopback) for the tests that need SQS or EC2.

Started once per test session, on a free port; nothing reaches the internet.
"""

from __future__ import annotations

import os
import socket

import pytest

_FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="session")
def moto_endpoint():
    """The endpoint URL of a moto server; boto3 gets throwaway credentials for it."""
    from moto.server import ThreadedMotoServer

    saved = {name: os.environ.get(name) for name in _FAKE_CREDENTIALS}
    os.environ.update(_FAKE_CREDENTIALS)
    port = _free_port()
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
