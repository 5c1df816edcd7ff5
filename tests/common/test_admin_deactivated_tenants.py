"""Rows a tenant owns are not added in the admin under a tenant that is deactivated: the
API never makes one (its callers' tenants are active), and a deactivation ends what the
tenant had (its schedules deactivated, its endpoints receive no event)."""

from __future__ import annotations

import pytest
from django.utils import timezone

from common.errors import Conflict
from schedule.models import Schedule
from schedule.services import schedule_create
from tests.factories import AutomationWithWorkerFactory, PlatformAdminFactory, TenantFactory
from webhook.models import WebhookEndpoint
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db


def schedule_form(tenant):
    return {
        "tenant": tenant.pk,
        "automation": AutomationWithWorkerFactory().pk,
        "name": "nightly",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "params": "{}",
        "misfire": "run_once",
    }


def endpoint_form(tenant):
    return {
        "tenant": tenant.pk,
        "url": "http://127.0.0.1:9/hook",
        "event_types": "JobCompleted",
        "description": "",
    }


@pytest.mark.parametrize(
    ("url", "form", "model"),
    [
        ("/admin/schedule/schedule/add/", schedule_form, Schedule),
        ("/admin/webhook/webhookendpoint/add/", endpoint_form, WebhookEndpoint),
    ],
)
def test_a_deactivated_tenant_is_refused_on_an_add_form(admin_client, settings, url, form, model):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    active = TenantFactory()
    retired = TenantFactory(is_active=False, deactivated_at=timezone.now())

    offered = admin_client.get(url).context["adminform"].form.fields["tenant"].queryset
    response = admin_client.post(url, form(retired))

    assert set(offered) == {active}
    assert response.status_code == 200, response.status_code
    assert "tenant" in response.context["adminform"].form.errors
    assert not model.objects.exists()
    # The same form for an active tenant goes through.
    assert admin_client.post(url, form(active)).status_code == 302
    assert model.objects.filter(tenant=active).count() == 1


@pytest.mark.parametrize(
    "create",
    [
        lambda tenant, actor: schedule_create(
            tenant=tenant,
            actor=actor,
            automation_id=AutomationWithWorkerFactory().pk,
            cron="0 3 * * *",
        ),
        lambda tenant, actor: endpoint_create(
            tenant=tenant,
            url="http://127.0.0.1:9/hook",
            event_types=["JobCompleted"],
            actor=actor,
        ),
    ],
    ids=["schedule", "endpoint"],
)
def test_the_services_refuse_a_deactivated_tenant_too(settings, create):
    """The add forms' choice is checked again by the creation itself: the tenant may be
    deactivated between the form's check and the save."""
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    retired = TenantFactory(is_active=False, deactivated_at=timezone.now())

    with pytest.raises(Conflict) as refused:
        create(retired, PlatformAdminFactory())

    assert refused.value.code == "tenant_inactive"
    assert not Schedule.objects.exists() and not WebhookEndpoint.objects.exists()
