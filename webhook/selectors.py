"""Reads of webhook endpoints and deliveries, always scoped to one tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from common.errors import NotFound
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint


def endpoint_list(*, tenant: Any) -> QuerySet[WebhookEndpoint]:
    return WebhookEndpoint.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def endpoint_get(*, tenant: Any, endpoint_id: int) -> WebhookEndpoint:
    """The tenant's endpoint; another tenant's is as absent as a missing one (404)."""
    endpoint = WebhookEndpoint.objects.filter(tenant=tenant, pk=endpoint_id).first()
    if endpoint is None:
        raise NotFound("No such webhook endpoint.", code="webhook_not_found")
    return endpoint


def delivery_list(*, tenant: Any, endpoint_id: int) -> QuerySet[WebhookDelivery]:
    """An endpoint's deliveries, newest first (``webhook_deliveries_recent_idx``)."""
    endpoint = endpoint_get(tenant=tenant, endpoint_id=endpoint_id)
    return WebhookDelivery.objects.filter(endpoint=endpoint).order_by("-created_at", "-id")


def attempts_of(delivery_ids: list[int]) -> dict[int, list[WebhookAttempt]]:
    attempts: dict[int, list[WebhookAttempt]] = {pk: [] for pk in delivery_ids}
    for attempt in WebhookAttempt.objects.filter(delivery_id__in=delivery_ids).order_by(
        "delivery_id", "number"
    ):
        attempts[attempt.delivery_id].append(attempt)
    return attempts
