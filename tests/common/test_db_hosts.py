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

import pytest
from django.db import connection
from django.db.backends.postgresql.base import DatabaseWrapper

pytestmark = pytest.mark.django_db


def test_a_silent_first_host_is_given_up_after_the_connect_timeout():
    own = connection.settings_dict
    timeout = own["OPTIONS"]["connect_timeout"]
    assert timeout == 5  # DB_CONNECT_TIMEOUT's default

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        config = {
            **own,
            "HOST": f"127.0.0.1,{own['HOST'] or '127.0.0.1'}",
            "PORT": f"{silent.getsockname()[1]},{own['PORT'] or 5432}",
            "OPTIONS": {**own["OPTIONS"], "target_session_attrs": "read-write"},
        }
        answer: list[object] = []

        def connect() -> None:
            wrapper = DatabaseWrapper(config, alias="several_hosts")
            try:
                with wrapper.cursor() as cursor:
                    cursor.execute("SELECT current_database(), pg_is_in_recovery()")
                    answer.append(cursor.fetchone())
            finally:
                wrapper.close()

        started = time.monotonic()
        worker = threading.Thread(target=connect, daemon=True)
        worker.start()
        worker.join(timeout=timeout * 4)
        took = time.monotonic() - started

    assert not worker.is_alive(), f"still connecting after {took:.1f} s"
    assert answer == [(own["NAME"], False)]
    assert timeout * 0.8 <= took < timeout * 2, took
