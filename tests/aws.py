"""A local AWS endpoint (moto's server on loopback) for the tests that need SQS or EC2.

Started once per test session, on a free port; nothing reaches the internet.
"""

from __future__ import annotations

import os

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
