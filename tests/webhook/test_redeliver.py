"""An operator's redelivery (``delivery_redeliver``): a final delivery attempted once more."""

from __future__ import annotations

import pytest
from django.utils import timezone

from common.errors import Conflict, NotFound
from tests.webhook.conftest import Reply, due_deliver_runs, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.delivery import delivery_redeliver
from webhook.models import WebhookAttempt, WebhookDelivery
from webhook.services import endpoint_disable

pytestmark = pytest.mark.django_db


def test_a_delivered_delivery_is_sent_again_with_its_webhook_id_and_a_new_attempt_number(
    receiver, make_endpoint, tenant, platform_admin
):
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    delivery = WebhookDelivery.objects.get()
    assert delivery.status == WebhookDelivery.Status.DELIVERED

    redelivered = delivery_redeliver(delivery_id=delivery.pk, actor=platform_admin)

    assert redelivered.status == WebhookDelivery.Status.PENDING
    assert redelivered.finished_at is None
    (row,) = due_deliver_runs()
    assert row.run_id == redelivered.scheduled_run_id
    assert row.available_at <= timezone.now()
    receiver.script(Reply(200))
    assert run_due_attempts() == 1
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED and delivery.attempts == 2
    first, second = receiver.requests()
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery.message_id
    numbers = WebhookAttempt.objects.filter(delivery=delivery).values_list("number", flat=True)
    assert sorted(numbers) == [1, 2]


def test_a_pending_delivery_is_refused(receiver, make_endpoint, tenant, platform_admin):
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    delivery = WebhookDelivery.objects.get()

    with pytest.raises(Conflict) as refused:
        delivery_redeliver(delivery_id=delivery.pk, actor=platform_admin)

    assert refused.value.code == "webhook_delivery_pending"
    assert len(due_deliver_runs()) == 1  # its own run only


def test_a_delivery_of_a_disabled_endpoint_is_refused(
    receiver, make_endpoint, tenant, manager, platform_admin
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    run_due_attempts()
    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager, reason="maintenance")
    delivery = WebhookDelivery.objects.get()

    with pytest.raises(Conflict) as refused:
        delivery_redeliver(delivery_id=delivery.pk, actor=platform_admin)

    assert refused.value.code == "webhook_disabled"
    delivery.refresh_from_db()
    assert delivery.status == WebhookDelivery.Status.DELIVERED


def test_an_unknown_delivery_is_not_found(platform_admin):
    with pytest.raises(NotFound):
        delivery_redeliver(delivery_id=987654, actor=platform_admin)
