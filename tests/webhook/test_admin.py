"""Webhooks in the Django admin: created and managed through the services, never deleted."""

from __future__ import annotations

import pytest

from webhook.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db

ENDPOINTS = "/admin/webhook/webhookendpoint/"


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


def test_adding_an_endpoint_shows_its_secret_once(admin_site, tenant, receiver):
    assert admin_site.get(f"{ENDPOINTS}add/").status_code == 200
    response = admin_site.post(
        f"{ENDPOINTS}add/",
        {
            "tenant": tenant.pk,
            "url": receiver.url,
            "event_types": "JobCompleted, JobFailed",
            "description": "",
        },
        follow=True,
    )
    endpoint = WebhookEndpoint.objects.get()
    assert endpoint.event_types == ["JobCompleted", "JobFailed"]
    assert endpoint.secret in response.content.decode()
    # Not on the change page afterwards.
    page = admin_site.get(f"{ENDPOINTS}{endpoint.pk}/change/").content.decode()
    assert endpoint.secret not in page


def test_a_refused_url_and_an_unknown_event_are_form_errors(admin_site, tenant, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    response = admin_site.post(
        f"{ENDPOINTS}add/",
        {"tenant": tenant.pk, "url": "https://10.0.0.1/x", "event_types": "JobExploded"},
    )
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert set(errors) == {"url", "event_types"}
    assert not WebhookEndpoint.objects.exists()


def test_the_actions_disable_enable_and_rotate(admin_site, make_endpoint, receiver):
    endpoint = make_endpoint(receiver.url)
    old_secret = endpoint.secret
    changelist = admin_site.get(ENDPOINTS)
    actions = dict(changelist.context["action_form"].fields["action"].choices)
    assert "delete_selected" not in actions

    admin_site.post(ENDPOINTS, {"action": "rotate_secret", "_selected_action": [endpoint.pk]})
    endpoint.refresh_from_db()
    assert endpoint.secret != old_secret

    admin_site.post(ENDPOINTS, {"action": "disable_selected", "_selected_action": [endpoint.pk]})
    endpoint.refresh_from_db()
    assert endpoint.status == "disabled" and endpoint.disabled_reason

    admin_site.post(ENDPOINTS, {"action": "enable_selected", "_selected_action": [endpoint.pk]})
    endpoint.refresh_from_db()
    assert endpoint.status == "active"


def test_deliveries_are_read_only(admin_site, make_endpoint, receiver, tenant):
    from tests.webhook.conftest import run_due_attempts
    from tests.webhook.test_delivery import complete_a_job

    make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    delivery = WebhookDelivery.objects.get()
    assert admin_site.get("/admin/webhook/webhookdelivery/").status_code == 200
    page = admin_site.get(f"/admin/webhook/webhookdelivery/{delivery.pk}/change/")
    assert page.status_code == 200
    assert admin_site.get("/admin/webhook/webhookdelivery/add/").status_code == 403


def test_an_endpoint_past_the_tenants_limit_is_a_form_error(
    admin_site, tenant, receiver, make_endpoint, settings
):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT = 1
    make_endpoint(receiver.url)

    response = admin_site.post(
        f"{ENDPOINTS}add/",
        {"tenant": tenant.pk, "url": receiver.url, "event_types": "JobCompleted"},
    )

    assert response.status_code == 200  # the form again, with the reason
    assert "its limit" in response.content.decode()
    assert WebhookEndpoint.objects.count() == 1


def test_an_endpoint_refused_after_its_form_was_valid_is_an_error_message_not_a_500(
    admin_site, tenant, receiver, make_endpoint, settings, monkeypatch
):
    # The form's early check passed; by the save, another creation took the last place.
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT = 1
    monkeypatch.setattr("webhook.admin.endpoint_limit_check", lambda *, tenant: None)
    make_endpoint(receiver.url)

    response = admin_site.post(
        f"{ENDPOINTS}add/",
        {"tenant": tenant.pk, "url": receiver.url, "event_types": "JobCompleted"},
        follow=True,
    )

    assert response.status_code == 200
    assert "its limit" in response.content.decode()
    assert WebhookEndpoint.objects.count() == 1
