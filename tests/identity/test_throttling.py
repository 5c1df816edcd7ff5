"""Login is throttled per client address and per email, with a clear 429."""

from __future__ import annotations

import pytest

from tests.identity.support import error_of, login

pytestmark = pytest.mark.django_db


@pytest.fixture
def low_rates(settings):
    settings.LOGIN_RATE_PER_EMAIL = "3/minute"
    settings.LOGIN_RATE_PER_IP = "5/minute"


def test_too_many_attempts_on_one_email_get_a_429_with_retry_after(api, member, low_rates):
    for _ in range(3):
        error_of(login(api, member.email, "wrong-password"), 401, "invalid_credentials")

    response = login(api, member.email)

    error = error_of(response, 429, "throttled")
    assert 0 < int(response["Retry-After"]) <= 60
    assert error["details"]["retry_after_seconds"] == int(response["Retry-After"])


def test_the_email_limit_holds_across_addresses_and_letter_case(api, member, low_rates):
    for n in range(3):
        login(api, member.email, "wrong-password", REMOTE_ADDR=f"10.0.0.{n + 1}")

    response = login(api, member.email.upper(), REMOTE_ADDR="10.0.0.99")

    error_of(response, 429, "throttled")


def test_too_many_attempts_from_one_address_get_a_429_whatever_the_email(api, low_rates):
    for n in range(5):
        login(api, f"guess{n}@example.com", "wrong-password", REMOTE_ADDR="10.1.1.1")

    error_of(login(api, "guess-last@example.com", REMOTE_ADDR="10.1.1.1"), 429, "throttled")
    assert login(api, "guess-last@example.com", REMOTE_ADDR="10.1.1.2").status_code == 401


def test_a_forwarded_for_header_does_not_dodge_the_address_limit(api, low_rates):
    for n in range(5):
        login(
            api,
            f"guess{n}@example.com",
            REMOTE_ADDR="10.2.2.2",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",
        )

    response = login(
        api, "guess-last@example.com", REMOTE_ADDR="10.2.2.2", HTTP_X_FORWARDED_FOR="192.0.2.77"
    )
    error_of(response, 429, "throttled")


def test_behind_a_trusted_proxy_the_forwarded_address_is_counted(api, low_rates, settings):
    settings.TRUSTED_PROXY_COUNT = 1
    for n in range(5):
        login(api, f"guess{n}@example.com", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="1.2.3.4")

    error_of(
        login(api, "x@example.com", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="1.2.3.4"), 429
    )
    assert (
        login(
            api, "x@example.com", REMOTE_ADDR="10.9.9.9", HTTP_X_FORWARDED_FOR="5.6.7.8"
        ).status_code
        == 401
    )


def test_a_successful_login_counts_too_but_within_the_limit_all_pass(api, member, low_rates):
    for _ in range(3):
        assert login(api, member.email).status_code == 200


def test_login_still_works_when_redis_is_down(api, member, settings, caplog):
    # Redis only accelerates: the counters are lost for a while, the logins are not.
    caches = {alias: dict(config) for alias, config in settings.CACHES.items()}
    caches["default"]["LOCATION"] = "redis://127.0.0.1:1/0"
    settings.CACHES = caches

    response = login(api, member.email)

    assert response.status_code == 200, response.content
    assert "login throttle" in caplog.text
