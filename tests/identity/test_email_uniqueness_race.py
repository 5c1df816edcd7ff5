"""Two registrations of one address in two spellings, at once: the pre-check and the unique
index compare the same normal form, so the race gives one 201 and one 409, never two users."""

from __future__ import annotations

import pytest

from identity.models import User
from tests.factories import ManagerFactory, TenantFactory
from tests.locks import all_past, sent_together

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.mark.parametrize(
    ("first", "second"),
    [("Isis@x.example", "ISIS@x.example"), ("kim@x.example", "\u212aim@x.example")],
)
def test_registrations_racing_past_the_check_give_one_201_and_one_409(monkeypatch, first, second):
    manager = ManagerFactory(tenant=TenantFactory())
    # Past the email's pre-check, before the save: both requests are past the check
    # before either writes, and the unique index decides.
    all_past(monkeypatch, User, "set_password")

    def register(email: str):
        return lambda client: client.post(
            "/api/v1/users",
            {"email": email, "password": "a-long-and-unusual-passphrase-91"},
            format="json",
        )

    answers = sent_together(manager, [register(first), register(second)])

    assert sorted(status for status, _ in answers) == [201, 409], answers
    assert [body["error"]["code"] for status, body in answers if status == 409] == ["email_taken"]
    assert User.objects.filter(tenant=manager.tenant).count() == 2
