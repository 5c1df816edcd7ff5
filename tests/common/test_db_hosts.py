"""Several PostgreSQL hosts in DATABASE_URL: a dead first host costs a connection its
``connect_timeout``, not TCP's minutes, and the next host serves.

The dead host is a socket that listens and never accepts: the kernel completes the TCP
handshake and nobody ever answers libpq's startup packet, as with a primary whose machine
froze. Without a connect timeout libpq waits there for good.
"""

from __future__ import annotations

import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from django.db import connection
from django.db.utils import load_backend

from common.postgresql.base import served_first

pytestmark = pytest.mark.django_db


@contextmanager
def silent_first_host() -> Iterator[dict]:
    """The test database's settings with a host before it that never answers."""
    own = connection.settings_dict
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        yield {
            **own,
            "HOST": f"127.0.0.1,{own['HOST'] or '127.0.0.1'}",
            "PORT": f"{silent.getsockname()[1]},{own['PORT'] or 5432}",
            "OPTIONS": {**own["OPTIONS"], "target_session_attrs": "read-write"},
        }


def connect(config: dict, alias: str) -> tuple[list[object], float]:
    """One connection of the project's backend (a new one: no connection reused), asked
    which database it reached; how long it took."""
    answer: list[object] = []

    def ask() -> None:
        wrapper = load_backend(config["ENGINE"]).DatabaseWrapper(config, alias=alias)
        try:
            with wrapper.cursor() as cursor:
                cursor.execute("SELECT current_database(), pg_is_in_recovery()")
                answer.append(cursor.fetchone())
        finally:
            wrapper.close()

    started = time.monotonic()
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout=config["OPTIONS"]["connect_timeout"] * 4)
    took = time.monotonic() - started
    assert not worker.is_alive(), f"still connecting after {took:.1f} s"
    return answer, took


def test_a_silent_first_host_is_given_up_after_the_connect_timeout():
    timeout = connection.settings_dict["OPTIONS"]["connect_timeout"]
    assert timeout == 5  # DB_CONNECT_TIMEOUT's default

    with silent_first_host() as config:
        answer, took = connect(config, alias=f"hosts-{uuid.uuid4()}")

    assert answer == [(connection.settings_dict["NAME"], False)]
    assert timeout * 0.8 <= took < timeout * 2, took


def test_the_host_that_served_last_is_asked_first_by_the_next_connection():
    # After a failover whose old primary vanished, every new connection (a request's, each
    # of the relay's claim connections) would wait out the connect timeout on it again.
    timeout = connection.settings_dict["OPTIONS"]["connect_timeout"]
    alias = f"hosts-{uuid.uuid4()}"

    with silent_first_host() as config:
        ports = config["PORT"]
        first = connect(config, alias)
        then = [connect(config, alias) for _ in range(3)]

    name = connection.settings_dict["NAME"]
    assert first[0] == [(name, False)] and timeout * 0.8 <= first[1], first
    assert all(answer == [(name, False)] for answer, _ in then), then
    assert all(took < timeout / 2 for _, took in then), [took for _, took in then]
    # The order is the process's memory, not a change to the settings.
    assert config["PORT"] == ports


@pytest.mark.parametrize(
    ("host", "port", "served", "expected"),
    [
        # A port for each host: the pair moves.
        ("db1,db2,db3", "5432,5433,5434", ("db3", "5434"), ("db3,db1,db2", "5434,5432,5433")),
        # One port for all, or none: the host moves.
        ("db1,db2", "5432", ("db2", "5432"), ("db2,db1", "5432")),
        ("db1,db2", "", ("db2", "5432"), ("db2,db1", "")),
        # First already, or not one of them (the URL changed): as given.
        ("db1,db2", "5432,5433", ("db1", "5432"), ("db1,db2", "5432,5433")),
        ("db1,db2", "5432,5433", ("db2", "5432"), ("db1,db2", "5432,5433")),
        ("db1,db2", "5432,5433", ("db9", "5433"), ("db1,db2", "5432,5433")),
    ],
)
def test_the_host_that_served_goes_first_with_its_port(host, port, served, expected):
    params = {"host": host, "port": port} if port else {"host": host}

    served_first(params, served)

    assert (params["host"], params.get("port", "")) == expected
