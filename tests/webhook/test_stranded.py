"""The monitor's check of webhook deliveries: stranded rows made by hand are found, given
their way forward and counted; young ones and ones that move are left alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from common.ways_forward import stranded_checks
from tests.monitor.conftest import monitor  # noqa: F401 (fixture)
from tests.observability.conftest import sample
from tests.webhook.conftest import Reply, due_deliver_runs, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.models import DELIVERY_WAYS_FORWARD, WebhookDelivery, WebhookEndpoint
from webhook.stranded import deliveries_stranded, overdue_after

pytestmark = pytest.mark.django_db


def parked_by_hand(endpoint, *, seconds_ago: float, failing: bool) -> WebhookDelivery:
    """A delivery parked with no probe: the shape the engine's defects used to leave."""
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(
        failing_since=timezone.now() - timedelta(seconds=600) if failing else None
    )
    delivery = WebhookDelivery.objects.filter(endpoint=endpoint).latest("id")
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        scheduled_run_id=None,
        next_attempt_at=None,
        created_at=timezone.now() - timedelta(seconds=seconds_ago),
    )
    delivery.refresh_from_db()
    return delivery


def test_the_check_is_registered_for_the_machine():
    assert stranded_checks()["webhook_deliveries"] is deliveries_stranded
    assert set(DELIVERY_WAYS_FORWARD) == {"scheduled", "parked", "held"}


def test_a_parked_delivery_with_no_probe_is_scheduled_and_then_delivered(
    receiver, make_endpoint, tenant
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    delivery = parked_by_hand(endpoint, seconds_ago=300, failing=True)
    for row in due_deliver_runs():
        row.delete()  # its old run is gone too

    (repaired,) = deliveries_stranded()

    assert repaired.row == f"webhook delivery {delivery.pk}"
    assert "no delivery on its way" in repaired.problem
    delivery.refresh_from_db()
    assert delivery.scheduled_run_id is not None
    run_due_attempts()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"
    assert deliveries_stranded() == []


def test_a_young_parked_delivery_is_left_alone(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    delivery = parked_by_hand(endpoint, seconds_ago=5, failing=True)
    assert deliveries_stranded() == []
    delivery.refresh_from_db()
    assert delivery.scheduled_run_id is None


def test_a_parked_delivery_behind_a_probe_is_left_alone(receiver, make_endpoint, tenant):
    endpoint = make_endpoint(receiver.url)
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()  # the probe retries
    complete_a_job(tenant)  # parked behind it
    WebhookDelivery.objects.filter(endpoint=endpoint).update(
        created_at=timezone.now() - timedelta(hours=1)
    )
    assert deliveries_stranded() == []


def test_a_scheduled_delivery_whose_run_died_gets_a_new_one(
    receiver, make_endpoint, tenant, settings
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    delivery = WebhookDelivery.objects.get(endpoint=endpoint)
    old_run = delivery.scheduled_run_id
    for row in due_deliver_runs():
        row.delete()  # dead-lettered and purged: nothing will make its attempt
    WebhookDelivery.objects.filter(pk=delivery.pk).update(
        next_attempt_at=timezone.now() - overdue_after() - timedelta(minutes=1)
    )

    (repaired,) = deliveries_stranded()

    assert "its run never made the attempt" in repaired.problem
    delivery.refresh_from_db()
    assert delivery.scheduled_run_id not in (None, old_run)
    run_due_attempts()
    delivery.refresh_from_db()
    assert delivery.status == "delivered"


def test_a_delivery_held_past_the_bound_ends_failed_with_the_reason(
    receiver, make_endpoint, tenant, manager, settings
):
    from webhook.services import endpoint_disable

    settings.WEBHOOK_HELD_MAX_AGE_SECONDS = 3600
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)
    endpoint_disable(tenant=tenant, endpoint_id=endpoint.pk, actor=manager)
    run_due_attempts()  # both held
    old, young = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id")
    WebhookDelivery.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(hours=2))

    (repaired,) = deliveries_stranded()

    assert repaired.row == f"webhook delivery {old.pk}"
    old.refresh_from_db()
    young.refresh_from_db()
    assert old.status == "failed" and "WEBHOOK_HELD_MAX_AGE_SECONDS" in old.last_error
    assert young.status == "pending" and young.scheduled_run_id is None


def test_the_monitor_counts_what_the_webhook_check_repaired(
    receiver,
    make_endpoint,
    tenant,
    monitor,  # noqa: F811
):
    endpoint = make_endpoint(receiver.url)
    complete_a_job(tenant)
    parked_by_hand(endpoint, seconds_ago=300, failing=False)
    before = sample("hubdommed_stranded_rows_total", machine="webhook_deliveries")

    counts = monitor.run_cycle()

    assert counts.stranded.repaired["webhook_deliveries"] == 1
    assert sample("hubdommed_stranded_rows_total", machine="webhook_deliveries") == before + 1
    assert monitor.run_cycle().stranded.repaired["webhook_deliveries"] == 0
