"""One normal form of an email everywhere: login, its throttle, uniqueness and every lookup.

The normal form is Unicode NFKC then case folding, computed in Python and stored, so
the database compares exactly what Python computed: no second idea of "the same letter"
(PostgreSQL's ``UPPER`` maps the dotless i, U+0131, to I; Python's ``lower`` leaves it alone).
"""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError

from identity.emails import normalize_email
from identity.models import User
from tests.factories import DEFAULT_PASSWORD, ManagerFactory, UserFactory
from tests.identity.support import client_for, error_of, login

pytestmark = pytest.mark.django_db


@pytest.fixture
def five_a_minute(settings):
    settings.LOGIN_RATE_PER_EMAIL = "5/minute"
    settings.LOGIN_RATE_PER_IP = "1000/minute"


@pytest.fixture
def isis(tenant):
    return UserFactory(tenant=tenant, email="isis@x.example")


def test_a_dotless_i_does_not_dodge_the_limit_of_an_email(api, isis, five_a_minute):
    for _ in range(5):
        error_of(login(api, "isis@x.example", "wrong-password"), 401, "invalid_credentials")

    response = login(api, "\u0131sis@x.example", DEFAULT_PASSWORD)

    assert response.status_code in (401, 429), response.content
    assert "access_token" not in response.json()


def test_a_dotless_i_is_another_address_than_i(api, isis):
    error_of(login(api, "\u0131sis@x.example"), 401, "invalid_credentials")
    error_of(login(api, "\u0130SIS@x.example"), 401, "invalid_credentials")


@pytest.mark.parametrize(
    "spelling",
    [
        "ISIS@X.EXAMPLE",
        "  Isis@x.Example ",
        "\uff49\uff53\uff49\uff53@x.example",  # fullwidth letters
        "i\u017fis@x.example",  # long s
    ],
    ids=["upper", "mixed and spaced", "fullwidth", "long s"],
)
def test_every_spelling_of_the_same_address_logs_in_and_shares_one_limit(
    api, isis, five_a_minute, spelling
):
    assert login(api, spelling).status_code == 200

    for _ in range(5):
        login(api, spelling, "wrong-password")

    error_of(login(api, "isis@x.example"), 429, "throttled")


def test_the_kelvin_sign_is_a_k(api, tenant):
    UserFactory(tenant=tenant, email="kim@x.example")

    assert login(api, "\u212aim@x.example").status_code == 200


def test_emails_are_stored_in_their_normal_form_whoever_creates_them(tenant):
    via_manager = User.objects.create_user("Ana@X.Example", DEFAULT_PASSWORD, tenant=tenant)
    via_factory = UserFactory(tenant=tenant, email="\uff22EA@x.example")
    via_superuser = User.objects.create_superuser("Root@X.Example", DEFAULT_PASSWORD)

    assert via_manager.email == "ana@x.example"
    assert via_factory.email == "bea@x.example"
    assert via_superuser.email == "root@x.example"
    assert User.objects.get_by_natural_key("ANA@x.example") == via_manager


def test_the_database_refuses_two_users_with_one_normal_form(tenant, isis):
    with pytest.raises(IntegrityError):
        User.objects.create_user("\uff29SIS@x.example", DEFAULT_PASSWORD, tenant=tenant)


@pytest.mark.parametrize(
    "email",
    ["ISIS@x.example", "\uff49sis@x.example", "i\u017fis@x.example"],
    ids=["upper", "fullwidth", "long s"],
)
def test_registering_another_spelling_of_a_taken_email_is_a_409(isis, email):
    manager = ManagerFactory(tenant=isis.tenant)

    response = client_for(manager).post(
        "/api/v1/users",
        {"email": email, "password": "a-long-and-unusual-passphrase-91"},
        format="json",
    )

    error_of(response, 409, "email_taken")
    assert User.objects.filter(tenant=isis.tenant).count() == 2


def test_a_registered_email_is_answered_in_its_normal_form(tenant):
    manager = ManagerFactory(tenant=tenant)

    response = client_for(manager).post(
        "/api/v1/users",
        {"email": "\uff2eew@X.Example", "password": "a-long-and-unusual-passphrase-91"},
        format="json",
    )

    assert response.status_code == 201, response.content
    assert response.json()["email"] == "new@x.example"


def test_createsuperuser_stores_the_normal_form_and_refuses_a_clash():
    call_command("createsuperuser", email="Boss@X.Example", interactive=False, verbosity=0)

    assert User.objects.get().email == "boss@x.example"
    with pytest.raises(CommandError):
        call_command("createsuperuser", email="BOSS@x.example", interactive=False, verbosity=0)


def test_the_normal_form_is_stable():
    for email in ["Isis@X.example", "\uff49\u017f\u0131s@x.example", "Stra\u00dfe@x.example"]:
        once = normalize_email(email)
        assert normalize_email(once) == once


def test_the_normal_form_of_every_character_is_its_own_normal_form():
    # What is stored is looked up by its own normal form: normalizing must be idempotent.
    unstable = [
        hex(code)
        for code in range(0x110000)
        if not 0xD800 <= code <= 0xDFFF
        and normalize_email(normalize_email(chr(code))) != normalize_email(chr(code))
    ]
    assert unstable == []


def test_the_admin_login_takes_any_spelling_of_the_address(client):
    from tests.factories import PlatformAdminFactory

    PlatformAdminFactory(email="root@x.example")

    assert client.login(email="\uff32OOT@X.example", password=DEFAULT_PASSWORD)
    assert not client.login(email="r\u0131oot@x.example", password=DEFAULT_PASSWORD)
