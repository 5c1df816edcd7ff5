"""Webhooks in the Django admin: created and managed through the services, never deleted."""

from __future__ import annotations

import re

import pytest
from django.db import transaction
from django.utils import timezone

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


DELIVERIES = "/admin/webhook/webhookdelivery/"


def delivered_and_failed(make_endpoint, receiver, tenant, other_tenant):
    """A delivery of a job's completion to an endpoint that answered 200, and one to another
    tenant's endpoint that answered 500 for good (its retries spent)."""
    from tests.webhook.conftest import Reply, run_due_attempts
    from tests.webhook.test_delivery import complete_a_job

    good = make_endpoint(receiver.url)
    bad = make_endpoint(f"{receiver.url}/other", tenant=other_tenant, actor=None)
    receiver.script(Reply(200))
    job = complete_a_job(tenant)
    other_job = complete_a_job(other_tenant)
    receiver.script(Reply(500))
    run_due_attempts()
    delivered = WebhookDelivery.objects.get(endpoint=good)
    failed = WebhookDelivery.objects.get(endpoint=bad)
    with transaction.atomic():
        failed = WebhookDelivery.objects.select_for_update().get(pk=failed.pk)
        failed.fail(now=timezone.now(), reason="HTTP 500 to the end")
        failed.save()
    return job, other_job, delivered, failed


def test_deliveries_filter_by_endpoint_and_tenant_and_link_their_job(
    admin_site, make_endpoint, receiver, tenant, other_tenant
):
    job, other_job, delivered, failed = delivered_and_failed(
        make_endpoint, receiver, tenant, other_tenant
    )

    def listed(**query) -> set[int]:
        response = admin_site.get(DELIVERIES, query)
        assert response.status_code == 200
        return {d.pk for d in response.context["cl"].result_list}

    assert listed(endpoint__id__exact=failed.endpoint_id) == {failed.pk}
    assert listed(tenant__id__exact=tenant.pk) == {delivered.pk}
    assert listed(job=other_job.pk) == {failed.pk}
    page = admin_site.get(DELIVERIES).content.decode()
    assert "Select webhook delivery to view" in page or "webhook deliveries" in page.lower()
    assert "Webhook deliverys" not in page
    assert f'href="/admin/job/job/{job.pk}/change/">job {job.pk}</a>' in page
    # A job id that is not one is a message on the list, not a 500.
    assert admin_site.get(DELIVERIES, {"job": "x"}).status_code in (200, 302)


def test_a_deliverys_page_shows_its_attempt_history(admin_site, make_endpoint, receiver, tenant):
    from tests.webhook.conftest import Reply, run_due_attempts
    from tests.webhook.test_delivery import complete_a_job

    make_endpoint(receiver.url)
    receiver.script(Reply(503, b"busy, come back"), Reply(200, b"thanks"))
    complete_a_job(tenant)
    run_due_attempts()
    run_due_attempts()
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 2

    page = admin_site.get(f"{DELIVERIES}{delivery.pk}/change/").content.decode()

    assert "busy, come back" in page and "thanks" in page
    assert ">503<" in page and ">200<" in page
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", page)


def test_redeliver_goes_through_the_service_for_final_deliveries_only(
    admin_site, make_endpoint, receiver, tenant, other_tenant
):
    from tests.webhook.conftest import Reply, run_due_attempts

    _, _, delivered, failed = delivered_and_failed(make_endpoint, receiver, tenant, other_tenant)
    receiver.script(Reply(200))

    response = admin_site.post(
        DELIVERIES,
        {"action": "redeliver", "_selected_action": [failed.pk]},
        follow=True,
    )

    assert "1 delivery(ies) due again now" in " ".join(str(m) for m in response.context["messages"])
    failed.refresh_from_db()
    assert failed.status == WebhookDelivery.Status.PENDING and failed.scheduled_run_id
    # (The stale retry run the hand-made failure left behind does nothing.)
    run_due_attempts()
    failed.refresh_from_db()
    assert failed.status == WebhookDelivery.Status.DELIVERED and failed.attempts == 2
    # A pending one is on its way already: refused, with the reason.
    WebhookDelivery.objects.filter(pk=delivered.pk).update(status="pending", finished_at=None)
    response = admin_site.post(
        DELIVERIES, {"action": "redeliver", "_selected_action": [delivered.pk]}, follow=True
    )
    assert "cannot be redelivered" in " ".join(str(m) for m in response.context["messages"])


def test_staff_without_the_change_permission_cannot_redeliver(
    client, make_endpoint, receiver, tenant, other_tenant
):
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    _, _, _, failed = delivered_and_failed(make_endpoint, receiver, tenant, other_tenant)
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(Permission.objects.get(codename="view_webhookdelivery"))
    client.force_login(staff)

    response = client.get(DELIVERIES)
    action_form = response.context["action_form"]
    assert action_form is None or "redeliver" not in dict(action_form.fields["action"].choices)
    client.post(DELIVERIES, {"action": "redeliver", "_selected_action": [failed.pk]})
    failed.refresh_from_db()
    assert failed.status == WebhookDelivery.Status.FAILED


def test_the_failing_filter_lists_active_endpoints_whose_attempts_fail(
    admin_site, make_endpoint, receiver
):
    failing = make_endpoint(receiver.url)
    make_endpoint(f"{receiver.url}/fine")
    WebhookEndpoint.objects.filter(pk=failing.pk).update(failing_since=timezone.now())

    response = admin_site.get(ENDPOINTS, {"health": "failing"})

    assert {e.pk for e in response.context["cl"].result_list} == {failing.pk}


def test_a_deliver_run_whose_attempt_failed_shows_the_attempt_not_succeeded(
    admin_site, make_endpoint, receiver, tenant
):
    """The task succeeds whatever the receiver answered (the delivery retries on its own):
    its run shows what the attempt got and where its delivery stands."""
    from outbox.models import TaskRun
    from tests.webhook.conftest import Reply, due_deliver_runs, run_attempt
    from tests.webhook.test_delivery import complete_a_job

    make_endpoint(receiver.url)
    complete_a_job(tenant)
    receiver.script(Reply(500))
    (row,) = due_deliver_runs()
    # As the worker runs it: started, the attempt, succeeded.
    started = timezone.now()
    run_attempt(row)
    TaskRun.objects.filter(run_id=row.run_id).update(
        status="succeeded", started_at=started, finished_at=timezone.now()
    )
    delivery = WebhookDelivery.objects.get()

    listing = admin_site.get("/admin/outbox/taskrun/", {"task": "webhook.deliver"})
    page = admin_site.get(f"/admin/outbox/taskrun/{row.run_id}/change/")

    for html in (listing.content.decode(), page.content.decode()):
        assert (
            f'<a class="not-delivered" href="{DELIVERIES}{delivery.pk}/change/">'
            f"delivery {delivery.pk} pending: attempt 1 failed (HTTP 500)</a>"
        ) in html
    assert '<span class="run-succeeded">succeeded</span>' not in listing.content.decode()
