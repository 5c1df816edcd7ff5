"""Use cases of a tenant's webhook endpoints: registering, changing, rotating the secret,
disabling and enabling one. Delivering the events is the delivery engine's
(``webhook.delivery``), which these call where a change of the endpoint moves its
deliveries.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.errors import InvalidInput, NotFound
from outbox.catalog import get_catalog
from webhook import transport
from webhook.delivery import deliveries_resume
from webhook.models import WebhookEndpoint
from webhook.signing import new_secret

URL_MAX_LENGTH = 2048


# --- endpoints ----------------------------------------------------------------------------


def validated_url(url: str) -> str:
    url = url.strip()
    if len(url) > URL_MAX_LENGTH:
        reason = f"at most {URL_MAX_LENGTH} characters"
    else:
        reason = transport.check_url(url)
    if reason:
        raise InvalidInput(
            f"The endpoint URL is refused: {reason}.",
            code="webhook_url_refused",
            details={"url": [reason]},
        )
    return url


def validated_event_types(event_types: list[str]) -> list[str]:
    known = get_catalog().events
    unknown = sorted({name for name in event_types if name not in known})
    if unknown:
        raise InvalidInput(
            f"Unknown event types: {', '.join(unknown)}.",
            code="webhook_unknown_event_type",
            details={"event_types": [f"Not an event of the hub: {name}." for name in unknown]},
        )
    if not event_types:
        raise InvalidInput(
            "Name at least one event type.",
            details={"event_types": ["Name at least one event type."]},
        )
    return sorted(set(event_types))


@transaction.atomic
def endpoint_create(
    *, tenant: Any, url: str, event_types: list[str], description: str = "", actor: Any
) -> WebhookEndpoint:
    """Register an endpoint; its ``secret`` is on the returned instance, shown once."""
    return WebhookEndpoint.objects.create(
        tenant_id=getattr(tenant, "pk", tenant),
        url=validated_url(url),
        event_types=validated_event_types(event_types),
        description=description,
        secret=new_secret(),
        created_by=actor,
    )


def _locked(tenant: Any, endpoint_id: int) -> WebhookEndpoint:
    endpoint = (
        WebhookEndpoint.objects.select_for_update(no_key=True)
        .filter(tenant_id=getattr(tenant, "pk", tenant), pk=endpoint_id)
        .first()
    )
    if endpoint is None:
        raise NotFound("No such webhook endpoint.", code="webhook_not_found")
    return endpoint


@transaction.atomic
def endpoint_update(
    *, tenant: Any, endpoint_id: int, data: dict[str, Any], actor: Any
) -> WebhookEndpoint:
    endpoint = _locked(tenant, endpoint_id)
    if "url" in data and validated_url(data["url"]) != endpoint.url:
        endpoint.url = validated_url(data["url"])
        # A new address: what was learnt of the old one's health no longer holds, and the
        # deliveries parked while it failed try the new one.
        endpoint.failing_since = None
        endpoint.answers_fast = False
        deliveries_resume(endpoint)
    if "event_types" in data:
        endpoint.event_types = validated_event_types(data["event_types"])
    if "description" in data:
        endpoint.description = data["description"]
    endpoint.updated_at = timezone.now()
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_rotate_secret(*, tenant: Any, endpoint_id: int, actor: Any) -> WebhookEndpoint:
    """A new secret (returned once); the old one keeps signing for the grace period."""
    endpoint = _locked(tenant, endpoint_id)
    endpoint.rotate(
        new_secret=new_secret(), grace=timedelta(seconds=settings.WEBHOOK_SECRET_GRACE_SECONDS)
    )
    endpoint.save()
    return endpoint


@transaction.atomic
def endpoint_disable(
    *, tenant: Any, endpoint_id: int, actor: Any, reason: str = ""
) -> WebhookEndpoint:
    endpoint = _locked(tenant, endpoint_id)
    endpoint.disable(reason=reason or "Disabled by a manager.")
    endpoint.save()
    # Its pending deliveries are held (parked) until it is enabled again.
    return endpoint


@transaction.atomic
def endpoint_enable(*, tenant: Any, endpoint_id: int, actor: Any) -> WebhookEndpoint:
    endpoint = _locked(tenant, endpoint_id)
    endpoint.enable()
    endpoint.save()
    deliveries_resume(endpoint)
    return endpoint
