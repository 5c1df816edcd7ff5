"""The request's time limit counts the host's DNS lookup too: a name whose servers answer
slowly, or never, ends the attempt as a timeout at ``WEBHOOK_TIMEOUT``, not when the
resolver gives up (which the tenant's own name servers decide)."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from webhook import transport

TIMEOUT = 1.0


@pytest.fixture
def stalled_dns(monkeypatch):
    """A resolver that answers hooks.example.test only when the test ends."""
    released = threading.Event()
    real = socket.getaddrinfo

    def getaddrinfo(host, port, *args, **kwargs):
        if host == "hooks.example.test":
            released.wait(60)
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", ("127.0.0.1", port))]
        return real(host, port, *args, **kwargs)

    monkeypatch.setattr(transport.socket, "getaddrinfo", getaddrinfo)
    yield
    released.set()


def test_a_lookup_that_never_ends_is_cut_at_the_time_limit(settings, stalled_dns):
    settings.WEBHOOK_TIMEOUT = TIMEOUT
    answers: list[transport.Answer] = []
    began = time.monotonic()
    thread = threading.Thread(
        target=lambda: answers.append(
            transport.post("http://hooks.example.test:9/hooks", b"{}", {})
        ),
        daemon=True,
    )
    thread.start()
    thread.join(15)

    assert answers, "the request was still waiting for its lookup after 15 s"
    # Cut at the limit, not when the resolver answers (a minute here): the margin is for a
    # loaded machine, far below that.
    assert time.monotonic() - began < TIMEOUT + 5
    (answer,) = answers
    assert answer.status_code is None
    assert answer.timed_out
    assert answer.error == f"timeout: the name did not resolve within {TIMEOUT:g} s"
