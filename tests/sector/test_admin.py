"""The sector admin: loads, saves through the services (same events), never deletes."""

from __future__ import annotations

import pytest

from outbox.models import Event
from sector.models import Sector
from tests.factories import AutomationFactory, SectorFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/sector/sector/"


def test_the_changelist_loads_with_filters_and_search(admin_site):
    SectorFactory(name="Finance")
    SectorFactory(name="Logistics", is_active=False)

    response = admin_site.get(CHANGELIST, {"q": "fin", "is_active__exact": "1"})

    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    actions = dict(response.context["action_form"].fields["action"].choices)
    assert "deactivate_selected" in actions and "delete_selected" not in actions


def test_adding_a_sector_records_sector_created_as_the_admin_user(
    admin_site, platform_admin, events
):
    assert admin_site.get(f"{CHANGELIST}add/").status_code == 200

    response = admin_site.post(
        f"{CHANGELIST}add/", {"name": "Finance", "slug": "finance", "description": ""}
    )

    assert response.status_code == 302, response.context["adminform"].errors
    sector = Sector.objects.get()
    assert sector.name == "Finance"
    assert events() == ["SectorCreated"]
    assert Event.objects.get().actor == f"user:{platform_admin.id}"


def test_a_duplicate_active_name_is_a_form_error(admin_site, events):
    SectorFactory(name="Finance")

    response = admin_site.post(f"{CHANGELIST}add/", {"name": "finance", "slug": "finance-2"})

    assert response.status_code == 200
    assert response.context["adminform"].form.errors
    assert Sector.objects.count() == 1 and events() == []


def test_changing_a_sector_records_sector_updated(admin_site, sector, events):
    url = f"{CHANGELIST}{sector.id}/change/"
    assert admin_site.get(url).status_code == 200

    response = admin_site.post(
        url, {"name": sector.name, "slug": sector.slug, "description": "New words"}
    )

    assert response.status_code == 302
    sector.refresh_from_db()
    assert sector.description == "New words"
    assert events() == ["SectorUpdated"]


def test_the_deactivate_action_retires_unused_sectors_and_reports_refusals(admin_site, events):
    unused, in_use = SectorFactory(), SectorFactory()
    AutomationFactory(sector=in_use)

    response = admin_site.post(
        CHANGELIST,
        {"action": "deactivate_selected", "_selected_action": [unused.id, in_use.id]},
        follow=True,
    )

    assert response.status_code == 200
    texts = [str(m) for m in response.context["messages"]]
    assert any("still classifies active automations" in t for t in texts)
    assert any("Deactivated 1 sector" in t for t in texts)
    assert list(Sector.objects.filter(is_active=True)) == [in_use]
    assert events() == ["SectorDeactivated"]


def test_sectors_cannot_be_deleted_in_the_admin(admin_site, sector):
    assert admin_site.get(f"{CHANGELIST}{sector.id}/delete/").status_code == 403
    assert admin_site.post(f"{CHANGELIST}{sector.id}/delete/", {"post": "yes"}).status_code == 403
    assert Sector.objects.filter(pk=sector.pk).exists()


def test_a_retired_sector_is_read_only(admin_site, events):
    retired = SectorFactory(is_active=False)
    url = f"{CHANGELIST}{retired.id}/change/"

    assert admin_site.get(url).status_code == 200
    assert admin_site.post(url, {"name": "X", "slug": "x"}).status_code == 403
    assert events() == []
