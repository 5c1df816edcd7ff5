"""Logging in: one answer for every wrong credential, none for closed accounts."""

from __future__ import annotations

import logging
from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from identity.models import RefreshToken
from identity.services import tenant_deactivate, user_deactivate
from identity.tokens import decode_access_token
from tests.factories import PlatformAdminFactory, UserFactory
from tests.identity.support import error_of, login, refresh

pytestmark = pytest.mark.django_db


def test_login_returns_an_access_token_and_a_refresh_token(api, member):
    response = login(api, member.email)

    assert response.status_code == 200, response.content
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert decode_access_token(body["access_token"])["sub"] == str(member.pk)
    assert body["refresh_token"].startswith("hdr_")
    assert 0 < body["expires_in"] <= 15 * 60
    assert response["Cache-Control"] == "no-store"


def test_the_access_token_opens_me(api, member):
    token = login(api, member.email).json()["access_token"]
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    me = api.get("/api/v1/me").json()

    assert me["id"] == member.pk
    assert me["email"] == member.email
    assert me["role"] == "member"
    assert me["tenant"]["id"] == member.tenant_id
    assert me["is_platform_admin"] is False


def test_a_platform_admin_logs_in_without_a_tenant(api):
    admin = PlatformAdminFactory()
    token = login(api, admin.email).json()["access_token"]
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    me = api.get("/api/v1/me").json()

    assert me["tenant"] is None
    assert me["role"] is None
    assert me["is_platform_admin"] is True


def test_the_email_is_matched_without_regard_to_case(api, member):
    assert login(api, f"  {member.email.upper()} ").status_code == 200


def test_the_refresh_token_is_stored_only_as_its_hash(api, member):
    token = login(api, member.email).json()["refresh_token"]

    (row,) = RefreshToken.objects.filter(user=member)
    assert token not in row.token_hash
    assert len(row.token_hash) == 64
    assert row.expires_at > timezone.now() + timedelta(days=29)


def test_a_wrong_password_and_an_unknown_email_get_the_same_answer(api, member):
    wrong_password = error_of(login(api, member.email, "not-the-password"), 401)
    unknown_email = error_of(login(api, "nobody@example.com", "not-the-password"), 401)

    assert wrong_password == unknown_email
    assert wrong_password["code"] == "invalid_credentials"
    assert not RefreshToken.objects.exists()


def test_an_unknown_email_still_costs_a_password_hash(api, monkeypatch):
    import identity.services as services

    checked = []
    real_check = services.check_password
    monkeypatch.setattr(
        services, "check_password", lambda *args: checked.append(args) or real_check(*args)
    )

    error_of(login(api, "nobody@example.com", "whatever"), 401, "invalid_credentials")

    assert len(checked) == 1


def test_a_deactivated_user_cannot_log_in(api, member, manager):
    user_deactivate(user=member, actor=manager)

    error_of(login(api, member.email), 403, "account_inactive")


def test_a_deactivated_user_with_a_wrong_password_learns_nothing_more(api, member, manager):
    user_deactivate(user=member, actor=manager)

    error_of(login(api, member.email, "not-the-password"), 401, "invalid_credentials")


def test_the_users_of_a_deactivated_tenant_cannot_log_in(api, member, platform_admin):
    tenant_deactivate(tenant=member.tenant, actor=platform_admin)

    error = error_of(login(api, member.email), 403, "account_inactive")
    assert "organization" in error["message"]


@pytest.mark.parametrize(
    "body",
    [{}, {"email": "a@example.com"}, {"password": "x"}, {"email": ["a"], "password": "x"}],
)
def test_an_incomplete_login_is_a_400(api, body):
    error_of(api.post("/api/v1/auth/login", body, format="json"), 400, "invalid")


def test_a_login_that_is_not_json_is_a_400(api):
    response = api.post("/api/v1/auth/login", "{oops", content_type="application/json")
    error_of(response, 400, "malformed_request")


def test_the_access_token_expires_after_fifteen_minutes(api, member):
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = login(api, member.email).json()["access_token"]
        api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        clock.shift(timedelta(minutes=14, seconds=59))
        assert api.get("/api/v1/me").status_code == 200

        clock.shift(timedelta(seconds=1))
        error = error_of(api.get("/api/v1/me"), 401, "token_expired")
        assert "expired" in error["message"]


def test_an_access_token_stops_working_when_its_user_is_deactivated(api, member, manager):
    token = login(api, member.email).json()["access_token"]
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")

    user_deactivate(user=member, actor=manager)

    error_of(api.get("/api/v1/me"), 401, "account_inactive")


def test_me_needs_a_token(api):
    error_of(api.get("/api/v1/me"), 401, "not_authenticated")


def test_logging_in_records_when(api):
    user = UserFactory()
    login(api, user.email)
    user.refresh_from_db()
    assert user.last_login is not None


def test_no_token_reaches_the_logs(api, member, caplog, settings):
    settings.REFRESH_REUSE_GRACE_SECONDS = 0  # so that the second refresh is reuse
    caplog.set_level(logging.DEBUG)
    first = login(api, member.email).json()
    second = refresh(api, first["refresh_token"]).json()
    refresh(api, first["refresh_token"])  # reuse: logged as a warning
    api.post("/api/v1/auth/logout", {"refresh_token": second["refresh_token"]}, format="json")

    for token in (first["access_token"], first["refresh_token"], second["refresh_token"]):
        assert token not in caplog.text
    assert "reused" in caplog.text
