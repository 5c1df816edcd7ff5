"""Reads of automations and workers that other modules may call.

Who sees a retired automation is decided here: a platform admin sees every automation,
everyone else the active ones only. A retired automation is then "not found" for them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db import models
from django.db.models import Q, QuerySet
from django.db.models.expressions import RawSQL
from django.db.models.functions import MD5, Cast

from automation.models import Automation, Worker
from common.errors import NotFound
from common.queries import narrowed, searched

if TYPE_CHECKING:
    from identity.models import User


def automation_get(automation_id: int, *, active_only: bool = False) -> Automation | None:
    queryset = Automation.objects.all()
    if active_only:
        queryset = queryset.filter(is_active=True)
    return queryset.filter(pk=automation_id).first()


@dataclass(frozen=True)
class JobTerms:
    """What a new job of an automation is checked against: whether the automation is
    active, and its parameter schema. ``schema_digest`` names the schema as stored (the
    MD5 of its jsonb text), for ``automation_id_on_terms``."""

    automation_id: int
    is_active: bool
    params_schema: dict[str, Any] | None
    schema_digest: str | None


def automation_job_terms(automation_id: int) -> JobTerms | None:
    """The automation's terms for new jobs as they are now; None when there is none."""
    row = (
        Automation.objects.filter(pk=automation_id)
        .values_list(
            "is_active",
            Cast("params_schema", models.TextField()),
            MD5(Cast("params_schema", models.TextField())),
        )
        .first()
    )
    if row is None:
        return None
    is_active, schema, digest = row
    return JobTerms(
        automation_id, is_active, None if schema is None else json.loads(schema), digest
    )


def automation_params_schemas(automation_ids) -> dict[int, dict[str, Any] | None]:
    """The parameter schema of each of these automations, by id (one read)."""
    return dict(
        Automation.objects.filter(pk__in=list(automation_ids)).values_list("id", "params_schema")
    )


_ID = models.BigIntegerField()


def automation_id_on_terms(terms: JobTerms) -> RawSQL:
    """The automation's id while it still has ``terms`` (active, the same schema), else
    NULL, evaluated by the statement it is part of: a new job's automation column, which
    refuses NULL, so that a job checked against terms read before its transaction is
    written only if they still hold when it is."""
    return RawSQL(
        'SELECT "id" FROM "automations" WHERE "id" = %s AND "is_active" '
        'AND md5("params_schema"::text) IS NOT DISTINCT FROM %s',
        (terms.automation_id, terms.schema_digest),
        output_field=_ID,
    )


def automation_time_limit(automation_id: int) -> timedelta | None:
    """How long one job of the automation may run (its ``timeout_seconds``); None when
    there is no such automation."""
    rows = Automation.objects.filter(pk=automation_id)
    seconds = rows.values_list("timeout_seconds", flat=True).first()
    return None if seconds is None else timedelta(seconds=seconds)


def automation_get_by_slug(slug: str) -> Automation | None:
    return Automation.objects.filter(slug=slug).first()


def automations_with_silent_workers(automation_ids, *, silent_since) -> list[int]:
    """Of ``automation_ids``, those whose active worker has not been heard from since
    ``silent_since`` (nor started or restarted since: its row's ``updated_at``)."""
    return list(
        Worker.objects.filter(
            automation_id__in=list(automation_ids), is_active=True, automation__is_active=True
        )
        .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=silent_since))
        .filter(updated_at__lt=silent_since)
        .order_by("automation_id")
        .values_list("automation_id", flat=True)
    )


def automations_visible_to(caller: User) -> QuerySet[Automation]:
    """Automations with their worker: all for a platform admin, the active ones for others."""
    queryset = Automation.objects.select_related("worker")
    if caller.is_platform_admin:
        return queryset
    return queryset.filter(is_active=True)


def automation_for_caller(*, caller: User, automation_id: int) -> Automation:
    automation = automations_visible_to(caller).filter(pk=automation_id).first()
    if automation is None:
        raise NotFound("The automation does not exist.")
    return automation


def automation_list(
    *,
    caller: User,
    active: bool | None = None,
    sector_id: int | None = None,
    search: str = "",
) -> QuerySet[Automation]:
    """The automations ``caller`` may see, in catalog order; ``active`` narrows them."""
    queryset = narrowed(automations_visible_to(caller), is_active=active, sector_id=sector_id)
    return searched(queryset, search)


def automation_count_active_in_sector(sector_id: int) -> int:
    """How many active automations a sector classifies (the sector's deactivation rule)."""
    return Automation.objects.filter(sector_id=sector_id, is_active=True).count()


def automation_ids_deactivated(*, before: datetime) -> list[int]:
    """The automations deactivated before ``before``: what is left of their jobs is ended
    (the catalog is small; this is a read of its rows, not of anyone's history)."""
    return list(
        Automation.objects.filter(is_active=False, deactivated_at__lt=before)
        .order_by("id")
        .values_list("id", flat=True)
    )
