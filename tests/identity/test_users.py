"""Users: managers run their own tenant's people, platform admins any tenant's."""

from __future__ import annotations

import pytest

from identity.models import User
from tests.factories import DEFAULT_PASSWORD, ManagerFactory, UserFactory
from tests.identity.support import error_of, events, login, outbox_counts

pytestmark = pytest.mark.django_db

NEW_USER = {
    "email": "New.Person@Example.com",
    "full_name": "New Person",
    "password": "a-long-and-unusual-passphrase-91",
}


def test_a_manager_registers_a_user_in_their_tenant(as_manager, manager, api):
    response = as_manager.post("/api/v1/users", NEW_USER, format="json")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["email"] == "new.person@example.com"
    assert body["tenant"] == manager.tenant_id
    assert body["role"] == "member"
    assert login(api, "NEW.person@example.com", NEW_USER["password"]).status_code == 200


def test_registering_records_user_registered_on_the_tenant_outbox(as_manager, manager):
    user_id = as_manager.post("/api/v1/users", NEW_USER, format="json").json()["id"]

    (event,) = events("UserRegistered")
    assert event.tenant_id == manager.tenant_id
    assert event.aggregate_type == "User"
    assert event.aggregate_id == str(user_id)
    assert event.actor == f"user:{manager.pk}"
    assert event.payload == {"user_id": user_id, "tenant_id": manager.tenant_id, "role": "member"}


def test_a_platform_admin_registers_a_manager_in_any_tenant(as_admin, other_tenant):
    response = as_admin.post(
        "/api/v1/users", {**NEW_USER, "tenant": other_tenant.pk, "role": "manager"}, format="json"
    )

    assert response.status_code == 201, response.content
    assert response.json()["tenant"] == other_tenant.pk
    assert response.json()["role"] == "manager"


def test_a_platform_admin_must_name_the_tenant(as_admin):
    error = error_of(as_admin.post("/api/v1/users", NEW_USER, format="json"), 400, "invalid")
    assert "tenant" in error["details"]


def test_a_manager_cannot_register_into_another_tenant(as_manager, other_tenant):
    response = as_manager.post(
        "/api/v1/users", {**NEW_USER, "tenant": other_tenant.pk}, format="json"
    )

    error_of(response, 404, "not_found")
    assert not User.objects.filter(email__iexact=NEW_USER["email"]).exists()


def test_nobody_registers_into_a_deactivated_tenant(as_admin, tenant):
    as_admin.post(f"/api/v1/tenants/{tenant.pk}/deactivate")
    response = as_admin.post("/api/v1/users", {**NEW_USER, "tenant": tenant.pk}, format="json")
    error_of(response, 409, "tenant_inactive")


def test_an_email_is_taken_whatever_its_case(as_manager, member):
    before = outbox_counts()

    response = as_manager.post(
        "/api/v1/users", {**NEW_USER, "email": member.email.upper()}, format="json"
    )

    error_of(response, 409, "email_taken")
    assert outbox_counts() == before


@pytest.mark.parametrize(
    "password", ["short", "password123", "12345678901234", "new.person@example.com"]
)
def test_weak_passwords_are_refused_by_the_password_validators(as_manager, password):
    before = outbox_counts()

    response = as_manager.post("/api/v1/users", {**NEW_USER, "password": password}, format="json")

    error = error_of(response, 400, "invalid")
    assert error["details"]["password"]
    assert outbox_counts() == before


@pytest.mark.parametrize(
    "body",
    [
        {"email": "not-an-email", "password": "a-long-and-unusual-passphrase-91"},
        {"email": "x@example.com", "password": "a-long-and-unusual-passphrase-91", "role": "boss"},
        {"email": "x@example.com"},
    ],
)
def test_bad_registrations_are_a_400(as_manager, body):
    error_of(as_manager.post("/api/v1/users", body, format="json"), 400, "invalid")
    assert not events("UserRegistered")


def test_a_manager_lists_only_their_tenant_with_filters_and_search(as_manager, manager, outsider):
    UserFactory(tenant=manager.tenant, full_name="Ana Souza", email="ana@example.com")
    UserFactory(tenant=manager.tenant, full_name="Bruno Lima", is_active=False)

    everyone = as_manager.get("/api/v1/users").json()
    inactive = as_manager.get("/api/v1/users", {"is_active": "false"}).json()
    by_name = as_manager.get("/api/v1/users", {"search": "souza"}).json()
    by_email = as_manager.get("/api/v1/users", {"search": "ANA@"}).json()

    assert {u["tenant"] for u in everyone["results"]} == {manager.tenant_id}
    assert everyone["count"] == 3
    assert [u["full_name"] for u in inactive["results"]] == ["Bruno Lima"]
    assert [u["email"] for u in by_name["results"]] == ["ana@example.com"]
    assert [u["email"] for u in by_email["results"]] == ["ana@example.com"]


def test_a_platform_admin_lists_every_tenant_or_one(as_admin, manager, outsider):
    assert as_admin.get("/api/v1/users").json()["count"] == 2
    only = as_admin.get("/api/v1/users", {"tenant": outsider.tenant_id}).json()
    assert [u["id"] for u in only["results"]] == [outsider.pk]


@pytest.mark.parametrize("caller", ["as_admin", "as_manager"])
def test_the_list_takes_the_same_three_queries_however_many_users_it_shows(
    request, caller, manager, django_assert_max_num_queries
):
    UserFactory.create_batch(6, tenant=manager.tenant)
    api = request.getfixturevalue(caller)

    # The caller with their tenant (access token), the page's count, then the page itself.
    with django_assert_max_num_queries(3):
        response = api.get("/api/v1/users")

    assert response.json()["count"] == 7


def test_a_manager_reads_and_updates_a_user_of_their_tenant(as_manager, member):
    assert as_manager.get(f"/api/v1/users/{member.pk}").json()["email"] == member.email

    response = as_manager.patch(
        f"/api/v1/users/{member.pk}", {"full_name": "Renamed", "role": "manager"}, format="json"
    )

    assert response.status_code == 200, response.content
    member.refresh_from_db()
    assert (member.full_name, member.role) == ("Renamed", "manager")


def test_an_empty_update_is_a_400(as_manager, member):
    error_of(as_manager.patch(f"/api/v1/users/{member.pk}", {}, format="json"), 400, "invalid")


def test_the_email_cannot_be_changed_by_update(as_manager, member):
    email = member.email
    as_manager.patch(
        f"/api/v1/users/{member.pk}", {"email": "x@example.com", "role": "member"}, format="json"
    )
    member.refresh_from_db()
    assert member.email == email


def test_deactivating_a_user_blocks_login_and_records_the_event(as_manager, manager, member, api):
    response = as_manager.post(f"/api/v1/users/{member.pk}/deactivate")

    assert response.status_code == 200, response.content
    assert response.json()["is_active"] is False
    (event,) = events("UserDeactivated")
    assert event.tenant_id == member.tenant_id
    assert event.actor == f"user:{manager.pk}"
    assert event.payload == {"user_id": member.pk, "tenant_id": member.tenant_id}
    error_of(login(api, member.email, DEFAULT_PASSWORD), 403, "account_inactive")


def test_a_user_is_deactivated_only_once(as_manager, member):
    as_manager.post(f"/api/v1/users/{member.pk}/deactivate")
    before = outbox_counts()

    error_of(as_manager.post(f"/api/v1/users/{member.pk}/deactivate"), 409, "already_inactive")
    assert outbox_counts() == before


def test_a_deactivated_user_cannot_be_updated(as_manager, member):
    as_manager.post(f"/api/v1/users/{member.pk}/deactivate")
    response = as_manager.patch(f"/api/v1/users/{member.pk}", {"role": "manager"}, format="json")
    error_of(response, 409, "user_inactive")


def test_a_manager_cannot_deactivate_themselves(as_manager, manager):
    error_of(
        as_manager.post(f"/api/v1/users/{manager.pk}/deactivate"), 409, "cannot_deactivate_self"
    )


def test_deleting_a_user_is_not_allowed_and_points_to_deactivate(as_manager, member):
    error = error_of(as_manager.delete(f"/api/v1/users/{member.pk}"), 405, "method_not_allowed")

    assert "/deactivate" in error["message"]
    member.refresh_from_db()
    assert member.is_active


# --- Another tenant's people are invisible: 404, never 403 -------------------------------


@pytest.mark.parametrize(
    ("method", "suffix", "body"),
    [
        ("get", "", None),
        ("patch", "", {"role": "manager"}),
        ("post", "/deactivate", None),
    ],
)
def test_another_tenants_user_is_a_404_for_reads_and_writes(
    as_outsider, member, method, suffix, body
):
    before = outbox_counts()

    response = getattr(as_outsider, method)(
        f"/api/v1/users/{member.pk}{suffix}", body, format="json"
    )

    assert error_of(response, 404, "not_found") == error_of(
        getattr(as_outsider, method)(f"/api/v1/users/999999{suffix}", body, format="json"),
        404,
        "not_found",
    )
    member.refresh_from_db()
    assert member.is_active and member.role == "member"
    assert outbox_counts() == before


def test_a_platform_admin_reaches_any_tenants_user(as_admin, member):
    assert as_admin.get(f"/api/v1/users/{member.pk}").status_code == 200
    assert as_admin.post(f"/api/v1/users/{member.pk}/deactivate").status_code == 200


def test_platform_admins_are_not_managed_through_the_users_api(as_admin, as_manager):
    other_admin = User.objects.create_superuser("root2@example.com", DEFAULT_PASSWORD)
    error_of(as_admin.get(f"/api/v1/users/{other_admin.pk}"), 404)
    error_of(as_manager.get(f"/api/v1/users/{other_admin.pk}"), 404)


# --- Members manage nobody ---------------------------------------------------------------


def test_a_member_cannot_list_register_update_or_deactivate(as_member, member, tenant):
    colleague = UserFactory(tenant=tenant)

    error_of(as_member.get("/api/v1/users"), 403, "forbidden")
    error_of(as_member.post("/api/v1/users", NEW_USER, format="json"), 403, "forbidden")
    error_of(as_member.get(f"/api/v1/users/{colleague.pk}"), 403, "forbidden")
    error_of(
        as_member.patch(f"/api/v1/users/{colleague.pk}", {"role": "manager"}, format="json"), 403
    )
    error_of(as_member.post(f"/api/v1/users/{colleague.pk}/deactivate"), 403, "forbidden")
    assert not events("UserRegistered") and not events("UserDeactivated")


def test_a_member_still_reads_themselves(as_member, member):
    assert as_member.get("/api/v1/me").json()["id"] == member.pk


def test_a_manager_of_a_deactivated_tenant_can_do_nothing(tenant, platform_admin):
    from identity.services import tenant_deactivate
    from tests.identity.support import client_for

    manager = ManagerFactory(tenant=tenant)
    client = client_for(manager)
    tenant_deactivate(tenant=tenant, actor=platform_admin)

    error_of(client.get("/api/v1/users"), 401, "account_inactive")
