"""Two registrations of one address in two spellings, at once: the pre-check and the unique
index compare the same normal form, so the race gives one 201 and one 409, never two users."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from identity.models import User
from tests.clients import client_of
from tests.factories import ManagerFactory, TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("first", "second"),
    [("Isis@x.example", "ISIS@x.example"), ("kim@x.example", "\u212aim@x.example")],
)
def test_registrations_racing_past_the_check_give_one_201_and_one_409(monkeypatch, first, second):
    manager = ManagerFactory(tenant=TenantFactory())
    start, after_check = threading.Barrier(2), threading.Barrier(2)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()
    set_password = User.set_password

    # Called after the email's pre-check, before the save: both requests are past the
    # check before either writes, and the unique index decides.
    def set_password_then_wait(user, raw):
        set_password(user, raw)
        after_check.wait(timeout=10)

    monkeypatch.setattr(User, "set_password", set_password_then_wait)

    def register(email: str) -> None:
        try:
            client = client_of(manager, raise_request_exception=False)
            start.wait(timeout=10)
            response = client.post(
                "/api/v1/users",
                {"email": email, "password": "a-long-and-unusual-passphrase-91"},
                format="json",
            )
            with lock:
                answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=register, args=(email,)) for email in (first, second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert sorted(status for status, _ in answers) == [201, 409], answers
    assert [body["error"]["code"] for status, body in answers if status == 409] == ["email_taken"]
    assert User.objects.filter(tenant=manager.tenant).count() == 2
