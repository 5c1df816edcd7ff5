"""A PostgreSQL host that vanishes once connected (a machine switched off, a network cut:
no reset, no answer) costs a connection ``DB_DEAD_HOST_TIMEOUT``, not TCP's quarter of an
hour.

Both ways a process can be talking to it end in an error: a statement sent after it
vanished (its bytes never acknowledged) and a statement sent before, whose answer never
comes (the keepalive probes go unanswered). An error is what every daemon already takes as
the database unreachable: it backs off and reconnects, and with several hosts in
``DATABASE_URL`` it finds the promoted standby. Without the options both waited for as long
as TCP retries, and a failover with them.

The server runs in a network namespace of its own, reached over a veth pair whose far end
the test takes down (``VanishingLink``): what is sent to it is dropped without a word.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from django.db import OperationalError, connection
from django.db.utils import load_backend

from tests.polling import wait_until
from tests.private_services import VanishingLink, VanishingPostgres

pytestmark = pytest.mark.django_db

SLEEPING = "SELECT pg_sleep(600) -- waiting on a host that vanishes"


@pytest.fixture
def vanishing_postgres() -> Iterator[tuple[VanishingLink, VanishingPostgres]]:
    link = VanishingLink()
    server = VanishingPostgres(link)
    try:
        link.start()
        server.start()
        yield link, server
    finally:
        server.close()
        link.close()


class Talk(threading.Thread):
    """A connection of the project's settings to ``server``: connected and asked once,
    then ``statement``, sent when ``go`` is set. Records how that ended, and how long it
    took from ``go``."""

    def __init__(self, server: VanishingPostgres, statement: str) -> None:
        super().__init__(daemon=True)
        self.server = server
        self.statement = statement
        self.connected = threading.Event()
        self.go = threading.Event()
        self.error: Exception | None = None
        self.took: float | None = None

    def run(self) -> None:
        config = {
            **connection.settings_dict,
            "NAME": "postgres",
            "USER": self.server.user,
            "PASSWORD": "",
            "HOST": self.server.host,
            "PORT": str(self.server.port),
        }
        wrapper = load_backend(config["ENGINE"]).DatabaseWrapper(config, alias="vanishing")
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT 1")
                self.connected.set()
                self.go.wait()
                started = time.monotonic()
                try:
                    cursor.execute(self.statement)
                except OperationalError as exc:
                    self.error = exc
                self.took = time.monotonic() - started
        finally:
            self.connected.set()
            wrapper.close()


def test_a_host_that_vanishes_is_given_up_within_the_dead_host_timeout(vanishing_postgres):
    options = connection.settings_dict["OPTIONS"]
    # DB_DEAD_HOST_TIMEOUT's default, 10 s.
    assert options["tcp_user_timeout"] == 10_000
    timeout = options["tcp_user_timeout"] / 1000
    link, server = vanishing_postgres

    asking = Talk(server, "SELECT 1")  # sends once the host is gone
    waiting = Talk(server, SLEEPING)  # sent before: waits for an answer that never comes
    for talk in (asking, waiting):
        talk.start()
        assert talk.connected.wait(30) and talk.error is None
    waiting.go.set()
    wait_until(
        lambda: (
            server.execute("SELECT count(*) FROM pg_stat_activity WHERE query = %s", [SLEEPING])
            == [(1,)]
        ),
        timeout=30,
        message="the long statement running on the server",
    )

    link.vanish()
    vanished = time.monotonic()
    asking.go.set()
    # Without the options both wait for TCP's retries, about 15 minutes.
    for talk in (asking, waiting):
        talk.join(timeout=timeout * 4)
    after = time.monotonic() - vanished

    assert not asking.is_alive(), (
        f"a statement sent to the vanished host still waits ({after:.0f} s)"
    )
    assert not waiting.is_alive(), f"a statement's answer still awaited ({after:.0f} s)"
    assert isinstance(asking.error, OperationalError), asking.error
    assert isinstance(waiting.error, OperationalError), waiting.error
    # Given up by the timeout, not by anything sooner: the bytes went unacknowledged for it.
    assert timeout * 0.8 <= asking.took < timeout * 3, asking.took
    # Keepalives from half the timeout on, the unanswered probe given up at the timeout.
    assert waiting.took < timeout * 3, waiting.took
