"""The events of one ``publish_many`` (a scheduler's batch of jobs) become deliveries as
``publish`` makes them one by one, with the tenants' endpoints read once for all of them."""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from outbox.services import Occurrence, publish_many
from tests.factories import ManagerFactory, TenantFactory
from webhook.models import WebhookDelivery

pytestmark = pytest.mark.django_db


def created(job_id: int, tenant) -> Occurrence:
    return Occurrence(
        "JobCreated",
        {"job_id": job_id, "automation_id": 1},
        aggregate=("Job", job_id),
        tenant=tenant,
    )


def test_a_batch_costs_the_same_statements_for_ten_tenants_as_for_two_hundred():
    statements = []
    for size in (10, 200):
        tenants = [TenantFactory() for _ in range(size)]
        with transaction.atomic(), CaptureQueriesContext(connection) as queries:
            publish_many(created(n, tenant) for n, tenant in enumerate(tenants))
        statements.append(len(queries))
    assert statements[0] == statements[1], statements


def test_only_the_events_an_endpoint_wants_become_its_deliveries(make_endpoint, receiver):
    wants_created = TenantFactory()
    wants_completed = TenantFactory()
    without = TenantFactory()
    make_endpoint(
        receiver.url,
        event_types=["JobCreated"],
        tenant=wants_created,
        actor=ManagerFactory(tenant=wants_created),
    )
    make_endpoint(
        receiver.url,
        event_types=["JobCompleted"],
        tenant=wants_completed,
        actor=ManagerFactory(tenant=wants_completed),
    )
    tenants = [wants_created, wants_completed, without] * 4
    with transaction.atomic():
        published = publish_many(created(n, tenant) for n, tenant in enumerate(tenants))

    deliveries = WebhookDelivery.objects.order_by("event_id")
    assert [d.tenant_id for d in deliveries] == [wants_created.pk] * 4
    assert [d.event_id for d in deliveries] == [
        p.event_id for p, tenant in zip(published, tenants, strict=True) if tenant == wants_created
    ]
    # Each with its first run, as publish's one-by-one listener gives it.
    assert all(d.scheduled_run_id is not None for d in deliveries)
