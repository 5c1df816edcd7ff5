"""Use cases of a tenant's webhook endpoints: registering, changing, rotating the secret,
disabling and enabling one. Delivering the events is the delivery engine's
(``webhook.delivery``), which these call where a change of the endpoint moves its
deliveries.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from common.errors import Conflict, InvalidInput, NotFound
from identity.selectors import tenant_is_active
from outbox.catalog import get_catalog
from outbox.services import dispatch
from webhook import transport
from webhook.delivery import deliveries_resume
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import WebhookEndpoint
from webhook.signing import new_secret

EXPIRE_SECRETS_TASK = "webhook.expire_secrets"
URL_MAX_LENGTH = 2048
# The advisory lock's first key: a tenant's endpoint creations wait for each other under it.
ENDPOINT_LOCK_NAMESPACE = 0x776868  # "whh"


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
    """The event types, if each is one a tenant may subscribe to (``TENANT_EVENT_TYPES``)."""
    allowed = ", ".join(TENANT_EVENT_TYPES)
    known = get_catalog().events
    unknown = sorted({name for name in event_types if name not in known})
    if unknown:
        raise InvalidInput(
            f"Unknown event types: {', '.join(unknown)}. Endpoints may subscribe to: {allowed}.",
            code="webhook_unknown_event_type",
            details={"event_types": [f"Not an event of the hub: {name}." for name in unknown]},
        )
    internal = sorted({name for name in event_types if name not in TENANT_EVENT_TYPES})
    if internal:
        raise InvalidInput(
            f"Not an event endpoints may subscribe to: {', '.join(internal)} (the hub's own). "
            f"Endpoints may subscribe to: {allowed}.",
            code="webhook_event_type_not_allowed",
            details={"event_types": [f"Not a tenant's event: {name}." for name in internal]},
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
    """Register an endpoint; its ``secret`` is on the returned instance, shown once. A
    tenant has at most ``WEBHOOK_MAX_ENDPOINTS_PER_TENANT`` active endpoints."""
    url = validated_url(url)
    event_types = validated_event_types(event_types)
    tenant_id = getattr(tenant, "pk", tenant)
    _hold_within_limit(tenant_id)
    # The API's callers are people of an active tenant already; the admin's are not.
    if not tenant_is_active(tenant_id):
        raise Conflict("The tenant is deactivated.", code="tenant_inactive")
    return WebhookEndpoint.objects.create(
        tenant_id=tenant_id,
        url=url,
        event_types=event_types,
        description=description,
        secret=new_secret(),
        created_by=actor,
    )


def _hold_within_limit(tenant_id: int) -> None:
    """Serialize the tenant's creations and enablings until the transaction ends, and
    refuse one past the limit. The lock makes the count and the write one step: two at
    once cannot both take the last place."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)", [ENDPOINT_LOCK_NAMESPACE, tenant_id % 2**31]
        )
    endpoint_limit_check(tenant=tenant_id)


def endpoint_limit_check(*, tenant: Any) -> None:
    """Conflict when the tenant has WEBHOOK_MAX_ENDPOINTS_PER_TENANT active endpoints.
    Every endpoint costs a delivery on each event of the tenant, so disabled ones (which
    receive none) do not count. Alone, an early answer for a form; the creation checks
    again under the lock."""
    limit = settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT
    active = WebhookEndpoint.objects.filter(
        tenant_id=getattr(tenant, "pk", tenant), status=WebhookEndpoint.Status.ACTIVE
    )
    if active.count() >= limit:
        raise Conflict(
            f"The tenant has {limit} active webhook endpoints, its limit: disable one first.",
            code="endpoint_limit_reached",
            details={"limit": limit},
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
    grace = settings.WEBHOOK_SECRET_GRACE_SECONDS
    endpoint.rotate(new_secret=new_secret(), grace=timedelta(seconds=grace))
    endpoint.save()
    if endpoint.previous_secret:
        # What erases the old secret when its grace ends: a run committed with the rotation,
        # due a moment after the grace (the outbox keeps it however long the hub is down).
        dispatch(
            EXPIRE_SECRETS_TASK,
            {"endpoint_id": endpoint.pk},
            tenant=endpoint.tenant_id,
            delay=grace + 1,
        )
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
    if not endpoint.is_active:
        # An active endpoint more: it counts against the limit as a new one would.
        _hold_within_limit(endpoint.tenant_id)
    endpoint.enable()
    endpoint.save()
    deliveries_resume(endpoint)
    return endpoint


# The endpoints one statement of the sweeps below reads and writes.
SECRETS_BATCH = 500


def endpoint_secrets_expire(
    *, endpoint_id: int | None = None, now: datetime | None = None, limit: int | None = None
) -> list[int]:
    """Erase the previous secrets whose grace ended by ``now``: the endpoint's (the
    ``webhook.expire_secrets`` run its rotation dispatched), or every endpoint's (the
    monitor's check, the re-encryption command), at most ``limit`` of them; returns the
    endpoints' ids. Such a secret signs nothing any more (``signing_secrets``): erased, a
    copy of the database cannot give it away. Rows another transaction holds (a rotation)
    are skipped: that rotation dispatched a run of its own."""
    now = now or timezone.now()
    expired = (
        WebhookEndpoint.objects.filter(
            Q(previous_secret_expires_at__lte=now) | Q(previous_secret_expires_at__isnull=True)
        )
        .exclude(previous_secret="")
        .only("id", "previous_secret", "previous_secret_expires_at")
        .order_by("id")
    )
    if endpoint_id is not None:
        expired = expired.filter(pk=endpoint_id)
    batch = min(limit, SECRETS_BATCH) if limit is not None else SECRETS_BATCH
    erased: list[int] = []
    while True:
        with transaction.atomic():
            endpoints = list(expired.select_for_update(no_key=True, skip_locked=True)[:batch])
            forgotten = [e for e in endpoints if e.forget_previous_secret(now=now)]
            WebhookEndpoint.objects.bulk_update(
                forgotten, ["previous_secret", "previous_secret_expires_at"]
            )
        erased += [endpoint.pk for endpoint in forgotten]
        if len(endpoints) < batch or (limit is not None and len(erased) >= limit):
            return erased


def endpoint_secrets_reencrypt() -> int:
    """Encrypt every stored secret again under the first of WEBHOOK_SECRET_KEYS (after a
    new key was put first); returns how many endpoints. Each batch is its own short
    transaction, so deliveries and rotations go on meanwhile.

    A batch skips the endpoints another transaction holds: an event's holds its endpoints
    ``FOR SHARE`` in the order of its events, so a batch that waited for one while holding
    others could close a cycle with it. Those are taken after the batches, one per
    transaction, each waiting for nothing but itself."""
    done, last_id, skipped = 0, 0, []
    endpoints = WebhookEndpoint.objects.only("id", "secret", "previous_secret").order_by("id")
    while True:
        with transaction.atomic():
            ids = list(
                WebhookEndpoint.objects.filter(pk__gt=last_id)
                .order_by("id")
                .values_list("id", flat=True)[:SECRETS_BATCH]
            )
            batch = list(
                endpoints.select_for_update(no_key=True, skip_locked=True).filter(pk__in=ids)
            )
            # Read through every key, written under the first one.
            WebhookEndpoint.objects.bulk_update(batch, ["secret", "previous_secret"])
        if not ids:
            break
        skipped += sorted(set(ids) - {endpoint.pk for endpoint in batch})
        done += len(batch)
        last_id = ids[-1]
    for endpoint_id in skipped:
        with transaction.atomic():
            held = list(endpoints.select_for_update(no_key=True).filter(pk=endpoint_id))
            WebhookEndpoint.objects.bulk_update(held, ["secret", "previous_secret"])
        done += len(held)
    return done
