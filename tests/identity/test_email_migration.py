"""The migration that puts existing emails in their normal form."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("identity", "0003_refresh_token_password_changed")]
AFTER = [("identity", "0004_email_normal_form")]


@pytest.fixture
def before_normal_form(transactional_db):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    yield executor.loader.project_state(BEFORE).apps
    # Every app's latest migration, not only identity's: going back to BEFORE unapplied
    # whatever depends on a later identity migration (other apps' tables), which the rest
    # of the suite needs back.
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def _tenant(apps):
    return apps.get_model("identity", "Tenant").objects.create(name="T", slug="t")


def test_existing_emails_are_put_in_their_normal_form(before_normal_form):
    User = before_normal_form.get_model("identity", "User")
    tenant = _tenant(before_normal_form)
    User.objects.create(email="Isis@X.Example", tenant=tenant, password="!")
    User.objects.create(email="\uff22ea@x.example", tenant=tenant, password="!")

    MigrationExecutor(connection).migrate(AFTER)

    from identity.models import User as Current

    assert sorted(Current.objects.values_list("email", flat=True)) == [
        "bea@x.example",
        "isis@x.example",
    ]


def test_two_emails_of_one_normal_form_stop_the_migration_and_are_named(before_normal_form):
    User = before_normal_form.get_model("identity", "User")
    tenant = _tenant(before_normal_form)
    first = User.objects.create(email="bea@x.example", tenant=tenant, password="!")
    second = User.objects.create(email="\uff22ea@x.example", tenant=tenant, password="!")

    with pytest.raises(RuntimeError, match=f"users {first.pk} and {second.pk}"):
        MigrationExecutor(connection).migrate(AFTER)

    User.objects.filter(pk=second.pk).update(email="other@x.example")
