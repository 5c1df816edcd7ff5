"""The forwarder's outage is whole: a connection it was still setting up when it closed is
cut too, not forwarded through the outage (a test would see its hub answer while away)."""

from __future__ import annotations

import contextlib
import socket
import threading

from tests import forwarding
from tests.forwarding import Forwarder


def test_a_connection_being_set_up_while_the_forwarder_closes_is_cut(monkeypatch):
    target = socket.create_server(("127.0.0.1", 0))
    closed = threading.Event()
    connecting = threading.Event()
    real_connect = socket.create_connection

    def connect_after_the_close(address, *args, **kwargs):
        # The forwarder's own connection to the target waits for the close.
        if address == target.getsockname():
            connecting.set()
            closed.wait(10)
        return real_connect(address, *args, **kwargs)

    monkeypatch.setattr(forwarding.socket, "create_connection", connect_after_the_close)
    forwarder = Forwarder(target.getsockname()).open()
    client = socket.create_connection(("127.0.0.1", forwarder.port), timeout=5)
    try:
        assert connecting.wait(10)
        forwarder.close()
        closed.set()

        # The target may see the connection made (the forwarder drops it at once): nothing
        # the client sends reaches it, and the client is hung up on, not left waiting.
        with contextlib.suppress(OSError):
            client.sendall(b"ping")
        target.settimeout(2)
        try:
            accepted, _ = target.accept()
        except TimeoutError:
            accepted = None
        if accepted is not None:
            with accepted:
                accepted.settimeout(5)
                assert accepted.recv(16) == b""
        client.settimeout(5)
        with contextlib.suppress(ConnectionResetError):
            assert client.recv(16) == b""
    finally:
        client.close()
        target.close()
