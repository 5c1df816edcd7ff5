"""Use cases of the sector catalog; each is one transaction with its events.

Deactivation rule: a sector that still classifies an active automation cannot be
deactivated. The request is refused with 409 ``sector_in_use`` (the details count the
active automations); deactivate or move those automations first. Nothing cascades: a
sector's retirement never silently takes automations out of service.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError
from django.core.validators import validate_slug
from django.db import transaction
from django.utils.text import slugify

from common.errors import Conflict, InvalidInput, NotFound
from common.models import save_or_refuse
from outbox.services import publish
from sector.models import Sector
from sector.selectors import sector_name_in_use
from sector.usage import sector_usage

NAME_MAX_LENGTH = Sector._meta.get_field("name").max_length
SLUG_MAX_LENGTH = Sector._meta.get_field("slug").max_length
UPDATABLE_FIELDS = frozenset({"name", "slug", "description"})


@transaction.atomic
def sector_create(*, name: str, slug: str = "", description: str = "", actor: Any) -> Sector:
    name, slug = _clean_name_and_slug(name=name, slug=slug)
    sector = Sector(name=name, slug=slug, description=description or "")
    _ensure_unique(sector)
    _save(sector)
    publish(
        "SectorCreated",
        {"sector_id": sector.id, "name": sector.name, "slug": sector.slug},
        aggregate=sector,
        actor=actor,
    )
    return sector


@transaction.atomic
def sector_update(*, sector_id: int, data: Mapping[str, Any], actor: Any) -> Sector:
    """Change name, slug or description. Publishes ``SectorUpdated`` only if something changed."""
    unknown = set(data) - UPDATABLE_FIELDS
    if unknown:
        raise InvalidInput(details={field: ["This field cannot be changed."] for field in unknown})
    sector = _locked(sector_id)
    sector.ensure_active()

    name = data.get("name", sector.name)
    slug = data.get("slug", sector.slug)
    name, slug = _clean_name_and_slug(name=name, slug=slug)
    values = {
        "name": name,
        "slug": slug,
        "description": data.get("description", sector.description),
    }
    changed = sorted(field for field, value in values.items() if getattr(sector, field) != value)
    if not changed:
        return sector
    for field in changed:
        setattr(sector, field, values[field])
    # Only what changes is checked: a row is never refused over its own name or slug.
    _ensure_unique(sector, fields=changed)
    _save(sector, update_fields=[*changed, "updated_at"])
    publish(
        "SectorUpdated",
        {"sector_id": sector.id, "changed": changed, "name": sector.name, "slug": sector.slug},
        aggregate=sector,
        actor=actor,
    )
    return sector


@transaction.atomic
def sector_deactivate(*, sector_id: int, actor: Any) -> Sector:
    """Retire a sector; refused with ``sector_in_use`` while active automations use it."""
    # FOR UPDATE waits for automations being filed under this sector right now
    # (sector_lock_for_use), so the count below includes them.
    sector = _locked(sector_id)
    sector.ensure_active()
    in_use = sector_usage(sector.id)
    if in_use:
        raise Conflict(
            "The sector still classifies active automations; deactivate or move them first.",
            code="sector_in_use",
            details=in_use,
        )
    sector.deactivate()
    sector.save(update_fields=["is_active", "deactivated_at", "updated_at"])
    publish("SectorDeactivated", {"sector_id": sector.id}, aggregate=sector, actor=actor)
    return sector


def _locked(sector_id: int) -> Sector:
    sector = Sector.objects.select_for_update().filter(pk=sector_id).first()
    if sector is None:
        raise NotFound("The sector does not exist.")
    return sector


def _clean_name_and_slug(*, name: Any, slug: Any) -> tuple[str, str]:
    errors: dict[str, list[str]] = {}
    name = name.strip() if isinstance(name, str) else ""
    if not name:
        errors["name"] = ["A name is required."]
    elif len(name) > NAME_MAX_LENGTH:
        errors["name"] = [f"At most {NAME_MAX_LENGTH} characters."]
    slug = (slug.strip() if isinstance(slug, str) else "") or slugify(name)
    if name and not slug:
        errors["slug"] = ["The name gives no slug; provide one."]
    elif slug:
        try:
            validate_slug(slug)
        except ValidationError:
            errors["slug"] = ["Letters, numbers, underscores or hyphens only."]
        if len(slug) > SLUG_MAX_LENGTH:
            errors.setdefault("slug", []).append(f"At most {SLUG_MAX_LENGTH} characters.")
    if errors:
        raise InvalidInput(details=errors)
    return name, slug


def _ensure_unique(sector: Sector, *, fields=("name", "slug")) -> None:
    """Refuse a name or slug (of ``fields``) that another sector has, as the indexes would."""
    if "name" in fields and sector_name_in_use(sector.name, excluding=sector.pk):
        raise _name_taken()
    if "slug" in fields and Sector.objects.exclude(pk=sector.pk).filter(slug=sector.slug).exists():
        raise _slug_taken()


def _save(sector: Sector, **kwargs: Any) -> None:
    # The checks above are not enough under concurrency: the database has the last word.
    save_or_refuse(sector, _refusal_for, **kwargs)


def _refusal_for(constraint: str) -> Conflict | None:
    if constraint == "sectors_active_name_key":
        return _name_taken()
    if "slug" in constraint:
        return _slug_taken()
    return None


def _name_taken() -> Conflict:
    return Conflict.over_field(
        "name", "An active sector already has this name.", code="sector_name_taken"
    )


def _slug_taken() -> Conflict:
    return Conflict.over_field("slug", "A sector already has this slug.", code="sector_slug_taken")
