"""seed_demo: demo data created once; its login always known to the checkout that runs it."""

from __future__ import annotations

import io

import pytest
from django.core.management import call_command

from automation.models import Automation
from identity.models import Tenant, User
from identity.services import user_login
from outbox.models import Event

pytestmark = pytest.mark.django_db


def seed(settings, base) -> str:
    settings.BASE_DIR = base
    settings.DEMO_LOGIN_FILE = str(base / "var" / "demo-login.txt")
    out = io.StringIO()
    call_command("seed_demo", stdout=out)
    return out.getvalue()


def test_seed_demo_creates_the_demo_once_through_the_services(settings, tmp_path):
    first = seed(settings, tmp_path)
    second = seed(settings, tmp_path)

    assert "password:" in first and "password in" in second
    assert Tenant.objects.filter(slug="demo").count() == 1
    assert User.objects.filter(email="manager@demo.example", role="manager").count() == 1
    greeter = Automation.objects.get(slug="greeter")
    assert greeter.worker.provider == "local"
    assert greeter.command[-1].endswith("scripts/demo_automation.py")
    assert Event.objects.filter(type="AutomationCreated").count() == 1
    email, password = (tmp_path / "var" / "demo-login.txt").read_text().split()
    assert user_login(email=email, password=password).access_token


def test_a_checkout_without_the_login_file_gets_a_fresh_password(settings, tmp_path):
    seed(settings, tmp_path / "first")
    old = (tmp_path / "first" / "var" / "demo-login.txt").read_text().split()[1]

    output = seed(settings, tmp_path / "second")

    email, password = (tmp_path / "second" / "var" / "demo-login.txt").read_text().split()
    assert password in output and password != old
    assert user_login(email=email, password=password).access_token
    assert User.objects.filter(email=email).count() == 1


def test_a_login_file_made_for_another_database_is_reissued(settings, tmp_path):
    """One checkout, two databases: the file holds the password of the first one's demo
    manager; seeding the second must leave a password that works there."""
    seed(settings, tmp_path)
    stale = (tmp_path / "var" / "demo-login.txt").read_text().split()[1]
    # The database the next run uses has its demo manager with another password.
    manager = User.objects.get(email="manager@demo.example")
    manager.set_password("not-the-file's")
    manager.save()

    output = seed(settings, tmp_path)

    email, password = (tmp_path / "var" / "demo-login.txt").read_text().split()
    assert password != stale and password in output
    assert user_login(email=email, password=password).access_token
