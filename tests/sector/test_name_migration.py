"""The migration that makes the active-name index compare what the pre-check compares."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

BEFORE = [("sector", "0001_initial")]
AFTER = [("sector", "0002_active_name_key_folds_both_cases")]


@pytest.fixture
def before_the_new_key(transactional_db):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    yield executor.loader.project_state(BEFORE).apps
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


def test_active_sectors_of_one_name_in_two_cases_stop_the_migration_and_are_named(
    before_the_new_key,
):
    Sector = before_the_new_key.get_model("sector", "Sector")
    # Both allowed by the old index (lower() keeps the final sigma apart).
    first = Sector.objects.create(name="ΟΔΟΣ x", slug="a")
    second = Sector.objects.create(name="οδος x", slug="b")
    Sector.objects.create(name="οδος y", slug="c", is_active=False)
    Sector.objects.create(name="ΟΔΟΣ y", slug="d")

    with pytest.raises(RuntimeError, match=f"sectors {first.pk}, {second.pk} are all"):
        MigrationExecutor(connection).migrate(AFTER)

    Sector.objects.filter(pk=second.pk).update(is_active=False)
    MigrationExecutor(connection).migrate(AFTER)

    from sector.models import Sector as Current

    with pytest.raises(IntegrityError), transaction.atomic():
        Current.objects.create(name="οδος x", slug="e")
