"""A transaction PostgreSQL aborts because it ran into another (a deadlock) is a 409
``concurrent_change`` to retry, in the one error format: not a 503 "unavailable" (the
database is fine) and not a 500; in the admin, a message on the page.

The deadlock is real: the request's transaction locks one row and then another, which
this test's own connection holds; this connection then asks for the first. PostgreSQL
finds the cycle and aborts the request's transaction (the one that waited first: this
connection's own deadlock check is put off for a minute).
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest
from django.db import connection, transaction
from django.test import Client

from common.daemon import Daemon
from common.errors import TransactionConflict, transaction_conflict
from sector import admin as sector_admin
from sector import api as sector_api
from sector.models import Sector
from tests.clients import client_of
from tests.factories import PlatformAdminFactory, SectorFactory
from tests.locks import Racer, another_session, until_another_waits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

LOCK = "SELECT 1 FROM sectors WHERE id = %s FOR UPDATE"


@pytest.fixture
def admin_user():
    return PlatformAdminFactory()


@pytest.fixture
def other_connection():
    with another_session() as conn:
        yield conn


@contextlib.contextmanager
def deadlocked(monkeypatch, module, name: str, other: psycopg.Connection):
    """``module.<name>`` deadlocks against ``other`` on its next call; yields the racer
    factory: the caller starts the request in it, this waits for the request to wait, and
    closes the cycle."""
    first, second = SectorFactory(), SectorFactory()
    real = getattr(module, name)

    def locking_first(*args, **kwargs):
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(LOCK, [first.pk])
            cursor.execute(LOCK, [second.pk])  # held by ``other``: waits, then aborted
            return real(*args, **kwargs)

    monkeypatch.setattr(module, name, locking_first)
    other.execute(LOCK, [second.pk])

    def start(target) -> Racer:
        racer = Racer("request", target).start()
        until_another_waits(done=racer.finished)
        other.execute(LOCK, [first.pk])  # the cycle: granted once the request is aborted
        return racer

    yield start


def test_a_deadlocked_request_is_a_409_to_try_again(
    monkeypatch, other_connection, admin_user, caplog
):
    sector = SectorFactory(name="Before")
    api = client_of(admin_user, raise_request_exception=False)
    with deadlocked(monkeypatch, sector_api, "sector_update", other_connection) as start:
        racer = start(
            lambda: api.patch(f"/api/v1/sectors/{sector.pk}", {"name": "After"}, format="json")
        )
        response = racer.join()

    assert response.status_code == 409, response.content
    assert response.json() == {
        "error": {
            "code": "concurrent_change",
            "message": TransactionConflict.default_message,
            "details": {},
        }
    }
    assert "Retry-After" not in response
    assert Sector.objects.get(pk=sector.pk).name == "Before"
    assert any("aborted by a deadlock" in record.getMessage() for record in caplog.records)


def test_a_deadlocked_admin_action_is_a_message_not_a_500(
    monkeypatch, other_connection, admin_user
):
    sector = SectorFactory()
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    with deadlocked(monkeypatch, sector_admin, "sector_deactivate", other_connection) as start:
        racer = start(
            lambda: client.post(
                "/admin/sector/sector/",
                {"action": "deactivate_selected", "_selected_action": [str(sector.pk)]},
                follow=True,
            )
        )
        response = racer.join()

    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any(TransactionConflict.default_message in message for message in shown), shown
    assert Sector.objects.get(pk=sector.pk).is_active


def test_a_deadlocked_admin_save_is_a_message_not_a_500(monkeypatch, other_connection, admin_user):
    sector = SectorFactory(name="Before")
    client = Client(raise_request_exception=False)
    client.force_login(admin_user)
    url = f"/admin/sector/sector/{sector.pk}/change/"
    form = {"name": "After", "slug": sector.slug, "description": sector.description}
    with deadlocked(monkeypatch, sector_admin, "sector_update", other_connection) as start:
        racer = start(lambda: client.post(url, form, follow=True))
        response = racer.join()

    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any(TransactionConflict.default_message in message for message in shown), shown
    assert Sector.objects.get(pk=sector.pk).name == "Before"


def test_only_the_aborts_of_a_conflict_are_conflicts():
    deadlock = psycopg.errors.DeadlockDetected("deadlock detected")
    serialization = psycopg.errors.SerializationFailure("could not serialize access")
    assert transaction_conflict(deadlock).reason == "deadlock"
    assert transaction_conflict(serialization).reason == "serialization failure"
    assert transaction_conflict(psycopg.errors.AdminShutdown("terminating")) is None
    assert transaction_conflict(psycopg.OperationalError("connection refused")) is None


def test_a_daemon_cycle_aborted_by_a_deadlock_says_so_and_goes_on(other_connection, caplog):
    first, second = SectorFactory(), SectorFactory()

    class Locking(Daemon):
        name = "locking"
        heartbeat = type("Beat", (), {"beat": lambda self: None})()

        def cycle(self):
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(LOCK, [first.pk])
                cursor.execute(LOCK, [second.pk])

    daemon = Locking()
    other_connection.execute(LOCK, [second.pk])
    racer = Racer("cycle", daemon.run_cycle).start()
    until_another_waits(done=racer.finished)
    other_connection.execute(LOCK, [first.pk])
    racer.join()

    lines = [record.getMessage() for record in caplog.records if record.name == "hubdommed.locking"]
    assert any("aborted by a deadlock" in line for line in lines), lines
    assert not any("unreachable" in line for line in lines), lines
    assert daemon.cycles == 1


def test_a_request_that_waits_past_the_lock_timeout_is_a_409_to_try_again(
    other_connection, admin_user, caplog
):
    # The row held by a session that keeps it (DB_LOCK_TIMEOUT is this one's bound; set
    # short here, on the request's own connection, for the test's sake).
    sector = SectorFactory(name="Before")
    other_connection.execute(LOCK, [sector.pk])
    with connection.cursor() as cursor:
        cursor.execute("SET lock_timeout = '300ms'")
    api = client_of(admin_user, raise_request_exception=False)
    try:
        response = api.patch(f"/api/v1/sectors/{sector.pk}", {"name": "After"}, format="json")
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET lock_timeout")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "concurrent_change"
    assert any("lock timeout" in r.getMessage() for r in caplog.records if r.levelname == "ERROR")
    other_connection.rollback()
    assert Sector.objects.get(pk=sector.pk).name == "Before"
