"""Concurrent login attempts get no more through than the limit allows.

Real threads, released together by a barrier, ask the throttles against the real Redis; each
round counts a key of its own. The count must be exact in every round: a read-then-write
counter lets several attempts read the same count and all pass.
"""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from django.db import connection
from rest_framework.test import APIClient

from identity.throttling import LoginRateByAddress, LoginRateByEmail
from tests.identity.support import error_of, login

ATTEMPTS = 20
ROUNDS = 10
LIMIT = 5


@pytest.fixture(autouse=True)
def low_rates(settings):
    settings.LOGIN_RATE_PER_EMAIL = f"{LIMIT}/minute"
    settings.LOGIN_RATE_PER_IP = f"{LIMIT}/minute"
    settings.TRUSTED_PROXY_COUNT = 1


def attempt(email: str, forwarded_for: str) -> SimpleNamespace:
    """What the throttles read of a login request: its headers and its body."""
    return SimpleNamespace(
        META={"REMOTE_ADDR": "10.0.0.1", "HTTP_X_FORWARDED_FOR": forwarded_for},
        data={"email": email, "password": "wrong-password"},
    )


def at_once(throttle_class, requests) -> list[tuple[bool, float | None]]:
    """Each request asked of its own throttle in its own thread, all released together."""
    barrier = threading.Barrier(len(requests))

    def ask(request):
        throttle = throttle_class()
        barrier.wait()
        allowed = throttle.allow_request(request, None)
        return allowed, None if allowed else throttle.wait()

    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        return list(pool.map(ask, requests))


def assert_exactly_the_limit_passes(results) -> None:
    allowed = [result for result in results if result[0]]
    refused = [wait for ok, wait in results if not ok]
    assert len(allowed) == LIMIT, f"{len(allowed)} of {ATTEMPTS} let through, limit {LIMIT}"
    # Each refusal says when to retry: within the window, not at once.
    assert all(wait is not None and 0 < wait <= 60 for wait in refused), refused


def test_concurrent_attempts_on_one_email_let_exactly_the_limit_through():
    for _ in range(ROUNDS):
        email = f"target-{uuid.uuid4().hex[:8]}@example.com"
        # Every attempt from another address and in another spelling: one email all the same.
        requests = [
            attempt(email.upper() if n % 2 else email, f"192.0.2.{n}") for n in range(ATTEMPTS)
        ]

        assert_exactly_the_limit_passes(at_once(LoginRateByEmail, requests))


def test_concurrent_attempts_from_one_address_let_exactly_the_limit_through():
    for round_ in range(ROUNDS):
        address = f"198.51.100.{round_}"
        requests = [attempt(f"guess{n}@example.com", address) for n in range(ATTEMPTS)]

        assert_exactly_the_limit_passes(at_once(LoginRateByAddress, requests))


def test_after_a_concurrent_burst_the_key_stays_refused():
    email = "burst@example.com"
    at_once(LoginRateByEmail, [attempt(email, f"192.0.2.{n}") for n in range(ATTEMPTS)])

    throttle = LoginRateByEmail()
    assert throttle.allow_request(attempt(email, "203.0.113.1"), None) is False
    assert 0 < throttle.wait() <= 60


@pytest.mark.django_db
def test_concurrent_logins_get_exactly_the_limit_checked_and_the_rest_a_429():
    # Through the endpoint, as the clients of the audit sent them: one email, each from
    # another address. The email is nobody's: the attempts that pass get a 401.
    email = "nobody@example.com"
    barrier = threading.Barrier(ATTEMPTS)

    def post(n):
        api = APIClient(raise_request_exception=False)
        barrier.wait()
        try:
            return login(
                api,
                email,
                "wrong-password",
                REMOTE_ADDR="10.0.0.1",
                HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",
            )
        finally:
            connection.close()  # this thread's own

    with ThreadPoolExecutor(max_workers=ATTEMPTS) as pool:
        responses = list(pool.map(post, range(ATTEMPTS)))

    statuses = sorted(response.status_code for response in responses)
    assert statuses == [401] * LIMIT + [429] * (ATTEMPTS - LIMIT)
    for response in responses:
        if response.status_code == 429:
            error = error_of(response, 429, "throttled")
            assert 0 < int(response["Retry-After"]) <= 60
            assert error["details"]["retry_after_seconds"] == int(response["Retry-After"])
