"""A platform admin is staff without a tenant, one rule everywhere: the API's permissions,
the lists that show admins more (the events trail, the users, the catalog) and the admin
site. The users table lets a staff account hold a tenant (its check only keeps people
without one staff); such an account, made in a shell, is its tenant's person, not a
platform admin that also reads every other tenant."""

from __future__ import annotations

import pytest

from identity.models import User
from outbox.models import Event
from tests.clients import client_of
from tests.factories import TenantFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_of_a_tenant():
    return User.objects.create_user(
        "staff-in-a-tenant@example.com",
        "a long enough password",
        tenant=TenantFactory(),
        role=User.Role.MANAGER,
        is_staff=True,
    )


def record(tenant) -> Event:
    return Event.objects.create(
        type="JobCreated",
        aggregate_type="Job",
        aggregate_id="1",
        tenant=tenant,
        actor="system",
        payload={},
    )


def test_it_reads_its_own_tenants_events_and_no_other(staff_of_a_tenant):
    own = record(staff_of_a_tenant.tenant)
    other = record(TenantFactory())

    response = client_of(staff_of_a_tenant, token=True).get(
        "/api/v1/events", {"tenant": other.tenant_id}
    )
    assert response.status_code == 200, response.json()
    assert response.json()["results"] == []

    response = client_of(staff_of_a_tenant, token=True).get("/api/v1/events")
    assert [event["id"] for event in response.json()["results"]] == [own.id]


def test_it_is_refused_what_only_platform_admins_may_do(staff_of_a_tenant):
    client = client_of(staff_of_a_tenant, token=True)

    assert client.get("/api/v1/tenants").status_code == 403
    assert client.get("/api/v1/me").json()["is_platform_admin"] is False


def test_the_admin_site_does_not_open_to_it(client, staff_of_a_tenant):
    client.force_login(staff_of_a_tenant)

    response = client.get("/admin/")

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
