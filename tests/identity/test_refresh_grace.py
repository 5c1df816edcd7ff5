"""Concurrent refreshes of one session: within the grace window the same refresh token
gets the same successor pair; after it, presenting it again is reuse and ends the session."""

from __future__ import annotations

import logging
import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from identity.models import RefreshToken, RevokeReason
from identity.services import user_login
from tests.factories import DEFAULT_PASSWORD, UserFactory
from tests.identity.support import error_of, login, refresh

pytestmark = pytest.mark.django_db


@pytest.fixture
def session(api, member):
    return login(api, member.email).json()


@pytest.mark.django_db(transaction=True)
def test_eight_concurrent_refreshes_of_one_token_all_get_the_same_successor(tenant):
    member = UserFactory(tenant=tenant)
    token = user_login(email=member.email, password=DEFAULT_PASSWORD).refresh_token
    contenders = 8
    start = threading.Barrier(contenders)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def contend() -> None:
        try:
            client = APIClient(raise_request_exception=False)
            start.wait()
            response = refresh(client, token)
            with lock:
                answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=contend) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [status for status, _ in answers] == [200] * contenders, answers
    assert len({body["refresh_token"] for _, body in answers}) == 1
    assert len({body["access_token"] for _, body in answers}) == 1
    # One successor, not one per caller, and the session is alive.
    assert RefreshToken.objects.count() == 2
    assert not RefreshToken.objects.filter(revoked_at__isnull=False).exists()
    successor = answers[0][1]["refresh_token"]
    assert refresh(APIClient(), successor).status_code == 200


def test_within_the_window_the_same_token_returns_the_same_pair(api, session):
    first = refresh(api, session["refresh_token"]).json()
    again = refresh(api, session["refresh_token"])

    assert again.status_code == 200, again.content
    again = again.json()
    assert again["refresh_token"] == first["refresh_token"]
    assert again["access_token"] == first["access_token"]
    assert again["refresh_token_expires_at"] == first["refresh_token_expires_at"]
    assert RefreshToken.objects.count() == 2
    # And the successor goes on working: the session was not ended.
    assert refresh(api, first["refresh_token"]).status_code == 200


def test_the_window_ends_after_the_configured_seconds(api, member, settings):
    settings.REFRESH_REUSE_GRACE_SECONDS = 10
    with time_machine.travel(timezone.now(), tick=False) as clock:
        token = login(api, member.email).json()["refresh_token"]
        successor = refresh(api, token).json()["refresh_token"]
        clock.shift(timedelta(seconds=10))
        assert refresh(api, token).json()["refresh_token"] == successor
        clock.shift(timedelta(seconds=1))

        error_of(refresh(api, token), 401, "refresh_token_reused")
        error_of(refresh(api, successor), 401, "invalid_refresh_token")
    assert set(RefreshToken.objects.values_list("revoke_reason", flat=True)) == {
        RevokeReason.REUSE_DETECTED
    }


def test_a_window_of_zero_seconds_makes_any_reuse_end_the_session(api, session, settings):
    settings.REFRESH_REUSE_GRACE_SECONDS = 0
    with time_machine.travel(timezone.now(), tick=False):
        refresh(api, session["refresh_token"])

        error_of(refresh(api, session["refresh_token"]), 401, "refresh_token_reused")


def test_once_the_successor_was_used_the_old_token_is_reuse_even_within_the_window(api, session):
    successor = refresh(api, session["refresh_token"]).json()["refresh_token"]
    newest = refresh(api, successor).json()["refresh_token"]

    # The chain moved on: whoever presents the first token again is not a racing twin.
    error_of(refresh(api, session["refresh_token"]), 401, "refresh_token_reused")
    error_of(refresh(api, newest), 401, "invalid_refresh_token")


def test_a_logged_out_session_gets_nothing_within_the_window(api, session):
    successor = refresh(api, session["refresh_token"]).json()["refresh_token"]
    api.post("/api/v1/auth/logout", {"refresh_token": successor}, format="json")

    error_of(refresh(api, session["refresh_token"]), 401)


def test_no_token_is_written_to_the_logs(api, session, caplog):
    with caplog.at_level(logging.DEBUG):
        first = refresh(api, session["refresh_token"]).json()
        refresh(api, session["refresh_token"])

    for secret in (session["refresh_token"], first["refresh_token"], first["access_token"]):
        assert secret not in caplog.text
    assert RefreshToken.objects.filter(token_hash__startswith="hdr_").count() == 0
