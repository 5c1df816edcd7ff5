"""Refresh tokens: each works once, a reused one ends its session, logout ends it too."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from common.errors import DomainError
from identity.models import RefreshToken, RevokeReason
from identity.services import (
    refresh_token_rotate,
    tenant_deactivate,
    user_deactivate,
    user_login,
)
from tests.factories import DEFAULT_PASSWORD, UserFactory
from tests.identity.support import error_of, login, refresh

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(api, member):
    """The token pair of a fresh login of ``member``."""
    return login(api, member.email).json()


def test_refresh_returns_a_new_pair_and_the_old_token_stops_working(api, session):
    response = refresh(api, session["refresh_token"])

    assert response.status_code == 200, response.content
    renewed = response.json()
    assert renewed["refresh_token"] != session["refresh_token"]
    assert renewed["access_token"] != session["access_token"]
    old = RefreshToken.objects.get(replaced_by__isnull=False)
    assert old.used_at is not None
    assert old.replaced_by.family == old.family


def test_the_new_refresh_token_refreshes_again(api, session):
    second = refresh(api, session["refresh_token"]).json()
    third = refresh(api, second["refresh_token"])

    assert third.status_code == 200
    assert RefreshToken.objects.filter(family=RefreshToken.objects.first().family).count() == 3


def test_reusing_a_rotated_token_revokes_the_whole_family(api, session):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        newest = refresh(api, session["refresh_token"]).json()["refresh_token"]
        clock.shift(timedelta(seconds=11))  # past the grace window of concurrent refreshes

        error_of(refresh(api, session["refresh_token"]), 401, "refresh_token_reused")

    # The newest token of the family is dead too: the thief's copy and the victim's alike.
    error_of(refresh(api, newest), 401, "invalid_refresh_token")
    assert set(RefreshToken.objects.values_list("revoke_reason", flat=True)) == {
        RevokeReason.REUSE_DETECTED
    }


def test_reuse_leaves_the_users_other_sessions_alone(api, member, session, settings):
    settings.REFRESH_REUSE_GRACE_SECONDS = 0
    other = login(api, member.email).json()
    refresh(api, session["refresh_token"])
    refresh(api, session["refresh_token"])

    assert refresh(api, other["refresh_token"]).status_code == 200


def test_logout_revokes_the_refresh_token(api, session):
    response = api.post(
        "/api/v1/auth/logout", {"refresh_token": session["refresh_token"]}, format="json"
    )

    assert response.status_code == 204
    error_of(refresh(api, session["refresh_token"]), 401, "invalid_refresh_token")
    assert RefreshToken.objects.get().revoke_reason == RevokeReason.LOGOUT


def test_logout_with_an_already_rotated_token_ends_the_session(api, session):
    newest = refresh(api, session["refresh_token"]).json()["refresh_token"]

    api.post("/api/v1/auth/logout", {"refresh_token": session["refresh_token"]}, format="json")

    error_of(refresh(api, newest), 401, "invalid_refresh_token")


def test_logout_with_an_unknown_token_says_nothing_about_it(api):
    response = api.post("/api/v1/auth/logout", {"refresh_token": "hdr_nope"}, format="json")
    assert response.status_code == 204


def test_an_unknown_refresh_token_is_refused(api):
    error_of(refresh(api, "hdr_not-a-real-token"), 401, "invalid_refresh_token")


def test_a_refresh_without_a_token_is_a_400(api):
    error_of(api.post("/api/v1/auth/refresh", {}, format="json"), 400, "invalid")


def test_the_refresh_token_expires_after_thirty_days(api, member):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = login(api, member.email).json()["refresh_token"]
        clock.shift(timedelta(days=30))

        error_of(refresh(api, token), 401, "refresh_token_expired")


def test_a_refresh_token_works_until_just_before_its_expiry(api, member):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = login(api, member.email).json()["refresh_token"]
        clock.shift(timedelta(days=30) - timedelta(seconds=1))

        assert refresh(api, token).status_code == 200


def test_the_lifetimes_come_from_settings(api, member, settings):
    settings.REFRESH_TOKEN_LIFETIME = timedelta(minutes=5)
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = login(api, member.email).json()["refresh_token"]
        clock.shift(timedelta(minutes=5))
        error_of(refresh(api, token), 401, "refresh_token_expired")


def test_deactivating_a_user_revokes_their_refresh_tokens(api, member, manager, session):
    user_deactivate(user=member, actor=manager)

    error_of(refresh(api, session["refresh_token"]), 401, "invalid_refresh_token")
    assert RefreshToken.objects.get().revoke_reason == RevokeReason.USER_DEACTIVATED


def test_deactivating_a_tenant_revokes_its_users_refresh_tokens(
    api, member, platform_admin, session
):
    elsewhere = UserFactory()
    kept = login(api, elsewhere.email).json()["refresh_token"]

    tenant_deactivate(tenant=member.tenant, actor=platform_admin)

    error_of(refresh(api, session["refresh_token"]), 401, "invalid_refresh_token")
    assert refresh(api, kept).status_code == 200


def test_a_new_password_ends_every_session_and_the_old_password(member):
    from identity.services import user_set_password

    pair = user_login(email=member.email, password=DEFAULT_PASSWORD)
    user_set_password(user=member, password="a-brand-new-passphrase-2026")

    with pytest.raises(DomainError):
        refresh_token_rotate(token=pair.refresh_token)
    assert RefreshToken.objects.filter(
        user=member, revoke_reason=RevokeReason.PASSWORD_CHANGED
    ).exists()
    with pytest.raises(DomainError):
        user_login(email=member.email, password=DEFAULT_PASSWORD)
    assert user_login(email=member.email, password="a-brand-new-passphrase-2026").access_token
