"""Sessions against the changes that end them, at the same moment: no deadlock between them,
and no session outlives a deactivation, a logout or a new password that committed after it.

Each race is forced at the database (``tests.locks``): one side is held inside its
transaction, once it took its locks, until the other waits on a row lock (or finished
without waiting); then both run on. Whoever PostgreSQL makes wait, both answers are
definite and the rows end where the later change puts them.
"""

from __future__ import annotations

import threading

import pytest
from rest_framework.test import APIClient

from identity import services
from identity.models import RefreshToken, Tenant, User
from identity.services import user_login
from tests.factories import DEFAULT_PASSWORD, ManagerFactory, PlatformAdminFactory, UserFactory
from tests.identity.support import client_for, login, refresh
from tests.locks import Racer, in_racer, until_another_waits

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture
def people(tenant):
    manager = ManagerFactory(tenant=tenant)
    member = UserFactory(tenant=tenant)
    token = user_login(email=member.email, password=DEFAULT_PASSWORD).refresh_token
    return manager, member, token


def held_in(racer: str, monkeypatch, name: str) -> tuple[threading.Event, threading.Event]:
    """Hold ``racer`` when it calls ``identity.services.<name>`` (its locks taken by then)
    until the test lets it go: returns (reached, go)."""
    reached, go = threading.Event(), threading.Event()
    real = getattr(services, name)

    def held(*args, **kwargs):
        if in_racer(racer):
            reached.set()
            assert go.wait(60), "never let go"
        return real(*args, **kwargs)

    monkeypatch.setattr(services, name, held)
    return reached, go


def race(first: Racer, reached: threading.Event, go: threading.Event, second: Racer):
    """``first`` held where it reached; ``second`` started and run until it waits on a lock
    or finishes; then ``first`` let go. Both answers, and whether ``second`` waited."""
    first.start()
    try:
        assert reached.wait(30), f"{first.name} never reached its hold"
        second.start()
        waited = until_another_waits(done=second.finished)
    finally:
        go.set()
    return first.join(), second.join(), waited


def live_tokens(user: User) -> list[RefreshToken]:
    return list(RefreshToken.objects.filter(user=user, revoked_at__isnull=True))


def deactivate_user(manager, member):
    return lambda: client_for(manager).post(f"/api/v1/users/{member.pk}/deactivate")


def deactivate_tenant(tenant):
    admin = PlatformAdminFactory()
    return lambda: client_for(admin).post(f"/api/v1/tenants/{tenant.pk}/deactivate")


@pytest.mark.parametrize("deactivated", ["user", "tenant"])
def test_a_refresh_under_way_is_waited_for_by_a_deactivation_that_then_ends_its_session(
    people, tenant, monkeypatch, deactivated
):
    manager, member, token = people
    reached, go = held_in("refresh", monkeypatch, "_new_refresh_token")
    deactivate = (
        deactivate_user(manager, member) if deactivated == "user" else deactivate_tenant(tenant)
    )

    rotated, deactivation, waited = race(
        Racer("refresh", lambda: refresh(APIClient(), token)),
        reached,
        go,
        Racer("deactivate", deactivate),
    )

    assert waited, "the second did not wait for the first"
    assert rotated.status_code == 200, rotated.content
    assert deactivation.status_code == 200, deactivation.content
    # The successor the refresh issued is revoked with the rest.
    assert RefreshToken.objects.filter(user=member).count() == 2
    assert live_tokens(member) == []
    follow_up = refresh(APIClient(), rotated.json()["refresh_token"])
    assert follow_up.status_code in (401, 403), follow_up.content


def test_a_refresh_that_comes_while_the_user_is_being_deactivated_is_refused(people, monkeypatch):
    manager, member, token = people
    reached, go = held_in("deactivate", monkeypatch, "_revoke")

    deactivation, rotated, waited = race(
        Racer("deactivate", deactivate_user(manager, member)),
        reached,
        go,
        Racer("refresh", lambda: refresh(APIClient(), token)),
    )

    assert waited, "the second did not wait for the first"
    assert deactivation.status_code == 200, deactivation.content
    assert rotated.status_code == 401, rotated.content
    assert rotated.json()["error"]["code"] == "invalid_refresh_token"
    assert RefreshToken.objects.filter(user=member).count() == 1
    assert live_tokens(member) == []


def test_a_tenant_and_one_of_its_users_deactivated_at_once_both_go_through(
    people, tenant, monkeypatch
):
    manager, member, _token = people
    reached, go = held_in("tenant", monkeypatch, "_revoke")

    of_tenant, of_user, _ = race(
        Racer("tenant", deactivate_tenant(tenant)),
        reached,
        go,
        Racer("user", deactivate_user(manager, member)),
    )

    assert of_tenant.status_code == 200, of_tenant.content
    assert of_user.status_code == 200, of_user.content
    assert not Tenant.objects.get(pk=tenant.pk).is_active
    assert not User.objects.get(pk=member.pk).is_active
    assert live_tokens(member) == []


def test_a_login_under_way_is_waited_for_by_a_deactivation_that_then_ends_its_session(
    people, monkeypatch
):
    manager, member, _token = people
    reached, go = held_in("login", monkeypatch, "_new_refresh_token")

    logged_in, deactivation, waited = race(
        Racer("login", lambda: login(APIClient(), member.email)),
        reached,
        go,
        Racer("deactivate", deactivate_user(manager, member)),
    )

    assert waited, "the second did not wait for the first"
    assert deactivation.status_code == 200, deactivation.content
    # Either the login went first and its session was ended, or it was refused.
    assert logged_in.status_code in (200, 403), logged_in.content
    assert live_tokens(member) == []


@pytest.mark.parametrize("given", ["the token refreshed", "an older token of the session"])
def test_a_logout_while_a_token_of_its_session_is_being_refreshed_ends_the_new_one_too(
    people, monkeypatch, given
):
    # Given an older token, nothing of the refresh holds the logout's own token: its
    # family's revocation once waited only for the refreshed token's row, on a snapshot
    # taken before the new token was written, which outlived the logout.
    _manager, member, token = people
    refreshed = token
    if given == "an older token of the session":
        refreshed = refresh(APIClient(), token).json()["refresh_token"]
    reached, go = held_in("refresh", monkeypatch, "_new_refresh_token")

    rotated, logged_out, waited = race(
        Racer("refresh", lambda: refresh(APIClient(), refreshed)),
        reached,
        go,
        Racer(
            "logout",
            lambda: APIClient().post(
                "/api/v1/auth/logout", {"refresh_token": token}, format="json"
            ),
        ),
    )

    assert waited, "the logout did not wait for the refresh"
    assert rotated.status_code == 200, rotated.content
    assert logged_out.status_code in (200, 204), logged_out.content
    assert live_tokens(member) == []
    assert refresh(APIClient(), rotated.json()["refresh_token"]).status_code == 401


def test_a_registration_under_way_is_waited_for_by_its_tenants_deactivation(
    people, tenant, monkeypatch
):
    manager, _member, _token = people
    reached, go = held_in("register", monkeypatch, "publish")
    email = "newcomer@example.com"

    registered, deactivation, waited = race(
        Racer(
            "register",
            lambda: client_for(manager).post(
                "/api/v1/users",
                {"email": email, "password": DEFAULT_PASSWORD, "full_name": "New"},
                format="json",
            ),
        ),
        reached,
        go,
        Racer("deactivate", deactivate_tenant(tenant)),
    )

    assert waited, "the deactivation did not wait for the registration"
    assert registered.status_code == 201, registered.content
    assert deactivation.status_code == 200, deactivation.content
    refused = login(APIClient(), email)
    assert refused.status_code == 403, refused.content
