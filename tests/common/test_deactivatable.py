"""The deactivate-only rule, shared by tenants, users, sectors and automations."""

from __future__ import annotations

import pytest

from common.errors import Conflict
from tests.factories import AutomationFactory, SectorFactory, TenantFactory, UserFactory

pytestmark = pytest.mark.django_db

REFUSALS = [
    # (factory, code of a second deactivation, code of a change to a deactivated row)
    (TenantFactory, "already_inactive", "tenant_inactive"),
    (UserFactory, "already_inactive", "user_inactive"),
    (SectorFactory, "sector_inactive", "sector_inactive"),
    (AutomationFactory, "automation_inactive", "automation_inactive"),
]


@pytest.mark.parametrize(("factory", "again", "change"), REFUSALS)
def test_a_row_is_deactivated_once_and_then_refuses_changes(factory, again, change):
    row = factory()
    row.ensure_active()
    assert (row.is_active, row.deactivated_at) == (True, None)

    row.deactivate()
    row.save()
    row.refresh_from_db()

    assert row.is_active is False
    assert row.deactivated_at is not None
    with pytest.raises(Conflict) as second:
        row.deactivate()
    assert second.value.code == again
    with pytest.raises(Conflict) as changed:
        row.ensure_active()
    assert changed.value.code == change
