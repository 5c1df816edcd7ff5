"""The sectors API: everyone reads active sectors, platform admins write."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from outbox.models import Event
from sector.models import Sector
from tests.factories import AutomationFactory, SectorFactory

pytestmark = pytest.mark.django_db


def names(response) -> list[str]:
    return [sector["name"] for sector in response.json()["results"]]


def test_people_list_only_active_sectors(person_api):
    SectorFactory(name="Finance")
    SectorFactory(name="Old", is_active=False)

    response = person_api.get("/api/v1/sectors")

    assert response.status_code == 200
    assert names(response) == ["Finance"]
    assert names(person_api.get("/api/v1/sectors?active=false")) == []


def test_platform_admins_list_every_sector_and_filter_them(admin_api):
    SectorFactory(name="Finance", description="money")
    SectorFactory(name="Logistics")
    SectorFactory(name="Old", is_active=False)

    assert names(admin_api.get("/api/v1/sectors")) == ["Finance", "Logistics", "Old"]
    assert names(admin_api.get("/api/v1/sectors?active=false")) == ["Old"]
    assert names(admin_api.get("/api/v1/sectors?search=MONEY")) == ["Finance"]


def test_the_list_takes_the_same_two_queries_however_many_sectors_it_shows(
    admin_api, django_assert_max_num_queries
):
    SectorFactory.create_batch(6)

    # The page's count, then the page itself.
    with django_assert_max_num_queries(2):
        response = admin_api.get("/api/v1/sectors")

    assert len(response.json()["results"]) == 6


def test_a_bad_filter_is_a_400_in_the_error_format(admin_api):
    response = admin_api.get("/api/v1/sectors?active=perhaps")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"
    assert "active" in response.json()["error"]["details"]


def test_a_retired_sector_is_not_found_for_people_but_readable_by_admins(person_api, admin_api):
    retired = SectorFactory(is_active=False)

    assert person_api.get(f"/api/v1/sectors/{retired.id}").status_code == 404
    assert admin_api.get(f"/api/v1/sectors/{retired.id}").json()["is_active"] is False


def test_anonymous_callers_are_not_authenticated(db):
    response = APIClient().get("/api/v1/sectors")

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_a_platform_admin_creates_a_sector(admin_api, platform_admin, events):
    response = admin_api.post("/api/v1/sectors", {"name": "Finance"}, format="json")

    assert response.status_code == 201
    body = response.json()
    assert (body["name"], body["slug"], body["is_active"]) == ("Finance", "finance", True)
    assert events() == ["SectorCreated"]
    assert Event.objects.get().actor == f"user:{platform_admin.id}"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/sectors", {"name": "Finance"}),
        ("patch", "/api/v1/sectors/{id}", {"name": "Renamed"}),
        ("post", "/api/v1/sectors/{id}/deactivate", None),
    ],
)
def test_people_who_are_not_platform_admins_cannot_write(
    person_api, sector, events, method, path, body
):
    response = getattr(person_api, method)(path.format(id=sector.id), body, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert Sector.objects.get() == sector and Sector.objects.get().name == sector.name
    assert events() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [({}, "name"), ({"name": ""}, "name"), ({"name": "Ok", "slug": "no spaces"}, "slug")],
)
def test_invalid_sector_input_is_a_400_in_the_error_format(admin_api, events, body, field):
    response = admin_api.post("/api/v1/sectors", body, format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid" and field in error["details"]
    assert events() == []


def test_a_duplicate_active_name_is_a_409(admin_api, sector):
    response = admin_api.post("/api/v1/sectors", {"name": sector.name.upper()}, format="json")

    assert response.status_code == 409
    assert response.json()["error"]["code"] == "sector_name_taken"


def test_a_platform_admin_updates_a_sector(admin_api, sector, events):
    response = admin_api.patch(
        f"/api/v1/sectors/{sector.id}", {"description": "All about money"}, format="json"
    )

    assert response.status_code == 200
    assert response.json()["description"] == "All about money"
    assert events() == ["SectorUpdated"]


def test_deactivating_a_sector_in_use_is_a_409_sector_in_use(admin_api, sector, events):
    AutomationFactory(sector=sector)

    response = admin_api.post(f"/api/v1/sectors/{sector.id}/deactivate")

    assert response.status_code == 409
    assert response.json()["error"] == {
        "code": "sector_in_use",
        "message": response.json()["error"]["message"],
        "details": {"active_automations": 1},
    }
    assert events() == []


def test_a_platform_admin_deactivates_a_sector(admin_api, sector, events):
    response = admin_api.post(f"/api/v1/sectors/{sector.id}/deactivate")

    assert response.status_code == 200 and response.json()["is_active"] is False
    assert events() == ["SectorDeactivated"]
    again = admin_api.post(f"/api/v1/sectors/{sector.id}/deactivate")
    assert again.status_code == 409 and again.json()["error"]["code"] == "sector_inactive"


def test_a_missing_sector_is_a_404(admin_api):
    response = admin_api.patch("/api/v1/sectors/999999", {"name": "Renamed"}, format="json")
    assert response.status_code == 404
    assert admin_api.post("/api/v1/sectors/999999/deactivate").status_code == 404


def test_delete_is_refused_and_points_to_deactivate(admin_api, sector):
    response = admin_api.delete(f"/api/v1/sectors/{sector.id}")

    assert response.status_code == 405
    error = response.json()["error"]
    assert error["code"] == "method_not_allowed"
    assert f"/api/v1/sectors/{sector.id}/deactivate" in error["message"]
    assert Sector.objects.filter(pk=sector.pk, is_active=True).exists()
