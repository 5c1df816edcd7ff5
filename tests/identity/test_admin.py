"""The Django admin: deactivation through the same services (and events), no deletion."""

from __future__ import annotations

import pytest
from django.urls import reverse

from identity.models import Tenant, User
from tests.factories import UserFactory
from tests.identity.support import events

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


def test_the_deactivate_action_deactivates_users_and_records_the_events(
    admin_site, platform_admin, tenant
):
    people = [UserFactory(tenant=tenant), UserFactory(tenant=tenant)]

    response = admin_site.post(
        reverse("admin:identity_user_changelist"),
        {"action": "deactivate", "_selected_action": [p.pk for p in people]},
        follow=True,
    )

    assert response.status_code == 200
    assert not User.objects.filter(pk__in=[p.pk for p in people], is_active=True).exists()
    recorded = events("UserDeactivated")
    assert {e.aggregate_id for e in recorded} == {str(p.pk) for p in people}
    assert {e.actor for e in recorded} == {f"user:{platform_admin.pk}"}


def test_the_deactivate_action_skips_what_is_already_inactive(admin_site, tenant):
    done = UserFactory(tenant=tenant, is_active=False)

    response = admin_site.post(
        reverse("admin:identity_user_changelist"),
        {"action": "deactivate", "_selected_action": [done.pk]},
        follow=True,
    )

    assert "already deactivated" in response.content.decode()
    assert not events("UserDeactivated")


def test_the_tenant_action_deactivates_through_the_service(admin_site, tenant):
    admin_site.post(
        reverse("admin:identity_tenant_changelist"),
        {"action": "deactivate", "_selected_action": [tenant.pk]},
    )

    tenant.refresh_from_db()
    assert not tenant.is_active
    assert len(events("TenantDeactivated")) == 1


def test_adding_a_tenant_in_the_admin_records_tenant_created(admin_site):
    response = admin_site.post(
        reverse("admin:identity_tenant_add"), {"name": "Admin Made", "slug": "admin-made"}
    )

    assert response.status_code == 302, response.content
    tenant = Tenant.objects.get(slug="admin-made")
    (event,) = events("TenantCreated")
    assert event.aggregate_id == str(tenant.pk)


@pytest.mark.parametrize(
    ("model", "make"), [("user", lambda t: UserFactory(tenant=t)), ("tenant", lambda t: t)]
)
def test_nothing_can_be_deleted_in_the_admin(admin_site, tenant, model, make):
    obj = make(tenant)

    response = admin_site.post(
        reverse(f"admin:identity_{model}_delete", args=[obj.pk]), {"post": "yes"}
    )
    actions = admin_site.get(reverse(f"admin:identity_{model}_changelist")).context["action_form"]

    assert response.status_code == 403
    assert type(obj).objects.filter(pk=obj.pk).exists()
    assert "delete_selected" not in dict(actions.fields["action"].choices)
