"""Races forced at the database: two callers in threads of their own, each with its own
connection, one held at a chosen point until the other waits on a row lock.

Only the moment is chosen (a wrapper waits, then calls the real function); every statement
runs against the real PostgreSQL, which itself decides who waits and who deadlocks.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import psycopg
from django.db import connection, connections


def backends_waiting_on_locks() -> int:
    """How many sessions of this test's database wait on a lock now (another connection's
    view, read on a connection of its own)."""
    with connections["default"].cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


def until_another_waits(done: Callable[[], bool] = lambda: False, timeout: float = 30.0) -> bool:
    """Block until another session waits on a lock (True), or ``done()`` says the other side
    finished without waiting (False). A lock wait never seen within ``timeout`` is an error
    of the test, not of the code under test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if backends_waiting_on_locks():
            return True
        if done():
            return False
        time.sleep(0.02)
    raise AssertionError(f"no session waited on a lock within {timeout} s")


class Racer:
    """``target`` in a thread named ``name``; what it returned or raised, once joined."""

    def __init__(self, name: str, target: Callable[[], object]) -> None:
        self.name = name
        self.result: object = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(target,), name=name)

    def _run(self, target: Callable[[], object]) -> None:
        try:
            self.result = target()
        except BaseException as exc:
            self.error = exc
        finally:
            connection.close()

    def start(self) -> Racer:
        self._thread.start()
        return self

    def finished(self) -> bool:
        return not self._thread.is_alive()

    def join(self, timeout: float = 60.0) -> object:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), f"{self.name} never finished"
        if self.error is not None:
            raise self.error
        return self.result


def in_racer(name: str) -> bool:
    return threading.current_thread().name == name


@contextlib.contextmanager
def another_session() -> Iterator[psycopg.Connection]:
    """A connection of the test's own to its database, in one transaction (rolled back at
    the end), that never looks for deadlocks itself for a minute: in a cycle it closes,
    PostgreSQL aborts the other side, the one that waited first."""
    params = connection.settings_dict
    conn = psycopg.connect(
        dbname=params["NAME"],
        host=params["HOST"],
        port=params["PORT"] or 5432,
        user=params["USER"],
        password=params["PASSWORD"] or None,
    )
    try:
        conn.execute("SET deadlock_timeout = '60s'")
        yield conn
    finally:
        conn.rollback()
        conn.close()


def all_past(monkeypatch, owner: object, name: str, count: int = 2) -> None:
    """``count`` callers of ``owner.<name>`` (a uniqueness check, say) each wait, after the
    real call, until all of them made it: they are all past it before any goes on to
    write, and the race is the database's to decide, every time."""
    together = threading.Barrier(count)
    real = getattr(owner, name)

    def then_wait(*args, **kwargs):
        result = real(*args, **kwargs)
        together.wait(timeout=10)
        return result

    monkeypatch.setattr(owner, name, then_wait)


def sent_together(user, requests: list[Callable]) -> list[tuple[int, dict]]:
    """Each of ``requests`` (a callable taking an API client of ``user``) sent from a
    thread and a database connection of its own, all released at once: their answers,
    (status, body), in no particular order."""
    from tests.clients import client_of

    start = threading.Barrier(len(requests))
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def send(request) -> None:
        try:
            client = client_of(user, raise_request_exception=False)
            start.wait(timeout=10)
            response = request(client)
            with lock:
                answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=send, args=(request,)) for request in requests]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    return answers
