"""Who sees a retired sector: decided by the selectors, whatever view asks."""

from __future__ import annotations

import pytest

from common.errors import NotFound
from sector.selectors import sector_for_caller, sector_list, sectors_visible_to
from sector.services import sector_deactivate
from tests.factories import SectorFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def sectors(platform_admin):
    active = SectorFactory()
    retired = SectorFactory()
    sector_deactivate(sector_id=retired.id, actor=platform_admin)
    return active, retired


def test_a_platform_admin_sees_retired_sectors_and_everyone_else_only_active_ones(
    sectors, platform_admin, user
):
    active, retired = sectors

    assert set(sectors_visible_to(platform_admin)) == {active, retired}
    assert list(sectors_visible_to(user)) == [active]


def test_asking_for_retired_sectors_shows_none_to_a_tenant_user(sectors, platform_admin, user):
    active, retired = sectors

    assert list(sector_list(caller=platform_admin, active=False)) == [retired]
    assert list(sector_list(caller=user, active=False)) == []
    assert list(sector_list(caller=user, active=True)) == [active]


def test_a_retired_sector_is_not_found_for_a_tenant_user(sectors, platform_admin, user):
    _, retired = sectors

    assert sector_for_caller(caller=platform_admin, sector_id=retired.id) == retired
    with pytest.raises(NotFound):
        sector_for_caller(caller=user, sector_id=retired.id)
