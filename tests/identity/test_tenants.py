"""Tenants: platform admins create, list, rename and deactivate them; nobody deletes them."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from identity.models import Tenant
from outbox.models import Event
from tests.clients import client_of
from tests.factories import PlatformAdminFactory, TenantFactory
from tests.identity.support import error_of, events, outbox_counts

pytestmark = pytest.mark.django_db


def test_a_platform_admin_creates_a_tenant_and_the_event_goes_to_the_platform_outbox(
    as_admin, platform_admin
):
    response = as_admin.post("/api/v1/tenants", {"name": "Acme Health"}, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["slug"] == "acme-health"
    assert body["is_active"] is True
    (event,) = events("TenantCreated")
    assert event.tenant_id is None
    assert event.aggregate_id == str(body["id"])
    assert event.actor == f"user:{platform_admin.pk}"
    assert event.payload == {"tenant_id": body["id"], "name": "Acme Health", "slug": "acme-health"}


def test_a_taken_slug_is_a_409_and_writes_nothing(as_admin):
    TenantFactory(slug="acme")
    before = outbox_counts()

    response = as_admin.post("/api/v1/tenants", {"name": "Acme", "slug": "acme"}, format="json")

    error_of(response, 409, "slug_taken")
    assert outbox_counts() == before


def test_a_derived_slug_avoids_the_taken_ones(as_admin):
    TenantFactory(slug="acme")
    assert as_admin.post("/api/v1/tenants", {"name": "Acme"}, format="json").json()["slug"] == (
        "acme-2"
    )


@pytest.mark.django_db(transaction=True)
def test_tenants_created_at_once_with_one_name_each_get_a_slug_of_their_own():
    # Each request derives its slug before any of the others has committed: they all see
    # "acme" free. A caller who chose no slug is never told that it is taken.
    admin = PlatformAdminFactory()
    contenders = 6
    start = threading.Barrier(contenders)
    answers: list[tuple[int, dict]] = []
    lock = threading.Lock()

    def create() -> None:
        try:
            client = client_of(admin, token=True, raise_request_exception=False)
            start.wait()
            response = client.post("/api/v1/tenants", {"name": "Acme"}, format="json")
            with lock:
                answers.append((response.status_code, response.json()))
        finally:
            connection.close()

    threads = [threading.Thread(target=create) for _ in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert [status for status, _ in answers] == [201] * contenders, answers
    slugs = {body["slug"] for _, body in answers}
    assert slugs == {"acme", *(f"acme-{n}" for n in range(2, contenders + 1))}
    assert set(Tenant.objects.values_list("slug", flat=True)) == slugs


def test_a_tenant_without_a_name_is_a_400(as_admin):
    error_of(as_admin.post("/api/v1/tenants", {"name": ""}, format="json"), 400, "invalid")
    error_of(as_admin.post("/api/v1/tenants", {"name": "  "}, format="json"), 400, "invalid")


def test_platform_admins_list_tenants_filtered_and_searched(as_admin):
    TenantFactory(name="Alpha Clinic")
    TenantFactory(name="Beta Lab", is_active=False)

    everyone = as_admin.get("/api/v1/tenants").json()
    active = as_admin.get("/api/v1/tenants", {"is_active": "true"}).json()
    found = as_admin.get("/api/v1/tenants", {"search": "beta"}).json()

    assert everyone["count"] == 2
    assert [t["name"] for t in active["results"]] == ["Alpha Clinic"]
    assert [t["name"] for t in found["results"]] == ["Beta Lab"]


def test_the_list_takes_the_same_three_queries_however_many_tenants_it_shows(
    as_admin, django_assert_max_num_queries
):
    TenantFactory.create_batch(6)

    # The caller (access token), the page's count, then the page itself.
    with django_assert_max_num_queries(3):
        response = as_admin.get("/api/v1/tenants")

    assert response.json()["count"] == 6


def test_a_bad_filter_is_a_400(as_admin):
    error_of(as_admin.get("/api/v1/tenants", {"is_active": "perhaps"}), 400, "invalid")


def test_a_platform_admin_reads_and_renames_a_tenant(as_admin, tenant):
    assert as_admin.get(f"/api/v1/tenants/{tenant.pk}").json()["name"] == tenant.name

    response = as_admin.patch(f"/api/v1/tenants/{tenant.pk}", {"name": "Renamed"}, format="json")

    assert response.status_code == 200
    tenant.refresh_from_db()
    assert tenant.name == "Renamed"


def test_an_unknown_tenant_is_a_404(as_admin):
    error_of(as_admin.get("/api/v1/tenants/999999"), 404, "not_found")


def test_deactivating_a_tenant_records_the_event_on_the_platform_outbox(
    as_admin, platform_admin, tenant
):
    response = as_admin.post(f"/api/v1/tenants/{tenant.pk}/deactivate")

    assert response.status_code == 200, response.content
    assert response.json()["is_active"] is False
    assert response.json()["deactivated_at"]
    (event,) = events("TenantDeactivated")
    assert event.tenant_id is None
    assert event.actor == f"user:{platform_admin.pk}"


def test_a_tenant_is_deactivated_only_once(as_admin, tenant):
    as_admin.post(f"/api/v1/tenants/{tenant.pk}/deactivate")

    error_of(as_admin.post(f"/api/v1/tenants/{tenant.pk}/deactivate"), 409, "already_inactive")
    assert Event.objects.filter(type="TenantDeactivated").count() == 1


def test_a_deactivated_tenant_cannot_be_renamed(as_admin, tenant):
    as_admin.post(f"/api/v1/tenants/{tenant.pk}/deactivate")
    response = as_admin.patch(f"/api/v1/tenants/{tenant.pk}", {"name": "New"}, format="json")
    error_of(response, 409, "tenant_inactive")


def test_deleting_a_tenant_is_not_allowed_and_points_to_deactivate(as_admin, tenant):
    error = error_of(as_admin.delete(f"/api/v1/tenants/{tenant.pk}"), 405, "method_not_allowed")

    assert "deactivate" in error["message"]
    assert Tenant.objects.filter(pk=tenant.pk, is_active=True).exists()


@pytest.mark.parametrize("caller", ["as_manager", "as_member"])
def test_tenant_people_cannot_manage_tenants(request, caller, tenant):
    client = request.getfixturevalue(caller)

    error_of(client.get("/api/v1/tenants"), 403, "forbidden")
    error_of(client.post("/api/v1/tenants", {"name": "Mine"}, format="json"), 403, "forbidden")
    error_of(client.get(f"/api/v1/tenants/{tenant.pk}"), 403, "forbidden")
    error_of(client.post(f"/api/v1/tenants/{tenant.pk}/deactivate"), 403, "forbidden")
    assert not events("TenantCreated") and not events("TenantDeactivated")


def test_anonymous_callers_are_asked_to_authenticate(api):
    error_of(api.get("/api/v1/tenants"), 401, "not_authenticated")
