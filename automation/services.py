"""Use cases of the automation catalog; each is one transaction with its events.

An automation and its worker are born together: ``automation_create`` writes both rows
and their events (``AutomationCreated``, ``WorkerRegistered``) in one transaction, so a
failure anywhere leaves neither. Worker events are events of the automation: their
aggregate is the automation. The worker's credential leaves this module once, in the
return value of ``automation_create`` or ``worker_rotate_credential``; only its sha256 is
stored.

Events (all on the platform outbox, ``actor`` the person who made the change):

- ``AutomationCreated`` + ``WorkerRegistered`` on creation;
- ``AutomationUpdated`` when the automation's own fields change, ``WorkerRegistered`` when
  the worker's machine (provider, machine id, region) changes; a no-op update records none;
- ``AutomationDeactivated`` + ``WorkerDeactivated`` on deactivation.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from automation.authentication import hash_credential, new_credential
from automation.models import MACHINE_FIELDS, Automation, Worker
from automation.validation import automation_errors, machine_errors
from common.errors import Conflict, InvalidInput, NotFound
from common.models import save_or_refuse
from outbox.services import dispatch, publish
from sector.selectors import sector_lock_for_use

UPDATABLE_FIELDS = frozenset(
    {
        "name",
        "slug",
        "description",
        "sector_id",
        "command",
        "max_concurrency",
        "timeout_seconds",
        "max_attempts",
        "params_schema",
    }
)


class CreatedAutomation(NamedTuple):
    automation: Automation
    # The worker's credential in plain text: show it once, it is not stored.
    credential: str


class RotatedCredential(NamedTuple):
    worker: Worker
    credential: str


@transaction.atomic
def automation_create(
    *,
    name: str,
    sector_id: int,
    command: list[str],
    slug: str = "",
    description: str = "",
    max_concurrency: int = 1,
    timeout_seconds: int = 3600,
    max_attempts: int = 1,
    params_schema: dict[str, Any] | None = None,
    provider: str = Worker.Provider.LOCAL,
    machine_id: str = "",
    region: str = "",
    actor: Any,
) -> CreatedAutomation:
    fields = {
        "name": name.strip() if isinstance(name, str) else name,
        "slug": (slug or "").strip() or (slugify(name) if isinstance(name, str) else ""),
        "description": description or "",
        "command": command,
        "max_concurrency": max_concurrency,
        "timeout_seconds": timeout_seconds,
        "max_attempts": max_attempts,
        "params_schema": params_schema,
    }
    errors = automation_errors(fields)
    errors.update(machine_errors(provider=provider, machine_id=machine_id, region=region))
    if fields["name"] and not fields["slug"] and "name" not in errors:
        errors["slug"] = ["The name gives no slug; provide one."]
    _raise_if(errors)
    _require_active_sector(sector_id)
    _require_free_slug(fields["slug"])

    automation = Automation(sector_id=sector_id, **fields)
    _save(automation)
    worker = Worker(automation=automation, provider=provider, machine_id=machine_id, region=region)
    credential = new_credential()
    worker.set_credential(credential, hash_credential(credential))
    worker.save()

    publish(
        "AutomationCreated",
        {
            "automation_id": automation.id,
            "sector_id": automation.sector_id,
            "name": automation.name,
            "slug": automation.slug,
            "max_concurrency": automation.max_concurrency,
        },
        aggregate=automation,
        actor=actor,
    )
    _publish_worker_registered(automation, worker, actor)
    return CreatedAutomation(automation=automation, credential=credential)


@transaction.atomic
def automation_update(
    *,
    automation_id: int,
    data: Mapping[str, Any] | None = None,
    machine: Mapping[str, Any] | None = None,
    actor: Any,
) -> Automation:
    """Change the automation's fields (``data``) and/or its worker's machine (``machine``)."""
    data = dict(data or {})
    machine = dict(machine or {})
    unknown = (set(data) - UPDATABLE_FIELDS) | {
        f"worker.{f}" for f in set(machine) - set(MACHINE_FIELDS)
    }
    if unknown:
        raise InvalidInput(details={field: ["This field cannot be changed."] for field in unknown})
    automation = _locked(automation_id)
    automation.ensure_active()
    worker = Worker.objects.select_for_update().get(automation_id=automation.id)

    if "name" in data and isinstance(data["name"], str):
        data["name"] = data["name"].strip()
    if "slug" in data:
        data["slug"] = data["slug"].strip() if isinstance(data["slug"], str) else data["slug"]
        if data["slug"] == "":
            data["slug"] = None  # reported as required below
    if "description" in data and data["description"] is None:
        data["description"] = ""
    new_machine = {field: machine.get(field, getattr(worker, field)) for field in MACHINE_FIELDS}
    errors = automation_errors({k: v for k, v in data.items() if k != "slug"})
    if "slug" in data:
        if not data["slug"]:
            errors["slug"] = ["A slug is required."]
        else:
            errors.update(automation_errors({"slug": data["slug"]}))
    if machine:
        errors.update(machine_errors(**new_machine))
    _raise_if(errors)

    changed = sorted(f for f in data if getattr(automation, f) != data[f])
    if "sector_id" in changed:
        _require_active_sector(data["sector_id"])
    if "slug" in changed:
        _require_free_slug(data["slug"], excluding=automation.id)
    for field in changed:
        setattr(automation, field, data[field])
    machine_changed = worker.register_machine(**new_machine)

    if changed:
        _save(automation, update_fields=[*changed, "updated_at"])
        publish(
            "AutomationUpdated",
            {
                "automation_id": automation.id,
                "changed": [field.removesuffix("_id") for field in changed],
                "sector_id": automation.sector_id,
                "max_concurrency": automation.max_concurrency,
            },
            aggregate=automation,
            actor=actor,
        )
    if machine_changed:
        worker.save(update_fields=[*MACHINE_FIELDS, "status", "last_seen_at", "updated_at"])
        _publish_worker_registered(automation, worker, actor)
    automation.worker = worker
    return automation


@transaction.atomic
def automation_deactivate(*, automation_id: int, actor: Any) -> Automation:
    """Retire the automation and its worker together."""
    automation = _locked(automation_id)
    automation.deactivate()
    worker = Worker.objects.select_for_update().get(automation_id=automation.id)
    worker.deactivate()
    automation.save(update_fields=["is_active", "deactivated_at", "updated_at"])
    worker.save(update_fields=["is_active", "status", "updated_at"])
    publish(
        "AutomationDeactivated",
        {"automation_id": automation.id, "sector_id": automation.sector_id},
        aggregate=automation,
        actor=actor,
    )
    publish(
        "WorkerDeactivated",
        {"automation_id": automation.id, "worker_id": worker.id},
        aggregate=automation,
        actor=actor,
    )
    automation.worker = worker
    return automation


# The task that restarts an automation's machine (tasks.json).
RESTART_TASK = "machines.restart"


@transaction.atomic
def worker_rotate_credential(
    *, automation_id: int, actor: Any, restart_worker: bool = True
) -> RotatedCredential:
    """Issue a new credential for the automation's worker; the old one stops working now.

    No event: the credential is a secret between the hub and the worker, and nothing
    outside the hub reacts to it. A worker running with the old credential would be
    refused from now on, so ``machines.restart`` is dispatched in the same transaction:
    its machine is restarted (a ``local`` one with a fresh credential of its own) within
    seconds. ``restart_worker=False`` is for the credential a power-on hands to the
    worker it is starting.
    """
    automation = _locked(automation_id)
    automation.ensure_active()
    worker = Worker.objects.select_for_update().get(automation_id=automation.id)
    if not worker.is_active:
        raise Conflict("The worker is not active.", code="worker_inactive")
    credential = new_credential()
    worker.set_credential(credential, hash_credential(credential))
    worker.save(
        update_fields=[
            "credential_hash",
            "credential_prefix",
            "credential_rotated_at",
            "updated_at",
        ]
    )
    if restart_worker:
        dispatch(RESTART_TASK, {"automation_id": automation.id})
    return RotatedCredential(worker=worker, credential=credential)


def _publish_worker_registered(automation: Automation, worker: Worker, actor: Any) -> None:
    publish(
        "WorkerRegistered",
        {
            "automation_id": automation.id,
            "worker_id": worker.id,
            "provider": worker.provider,
            "machine_id": worker.machine_id,
            "region": worker.region,
        },
        aggregate=automation,
        actor=actor,
    )


def _locked(automation_id: int) -> Automation:
    automation = Automation.objects.select_for_update().filter(pk=automation_id).first()
    if automation is None:
        raise NotFound("The automation does not exist.")
    return automation


def _require_active_sector(sector_id: Any) -> None:
    # Share-locked until commit, so the sector cannot be deactivated under us.
    sector = sector_lock_for_use(sector_id) if _is_id(sector_id) else None
    if sector is None:
        raise InvalidInput(details={"sector": ["The sector does not exist."]})
    if not sector.is_active:
        raise InvalidInput(details={"sector": ["The sector is not active."]})


def _require_free_slug(slug: str, *, excluding: int | None = None) -> None:
    if Automation.objects.exclude(pk=excluding).filter(slug=slug).exists():
        raise _slug_taken()


def _save(automation: Automation, **kwargs: Any) -> None:
    # Two creations racing for one slug: the unique index decides, the loser gets a 409.
    save_or_refuse(automation, _refusal_for, **kwargs)


def _refusal_for(constraint: str) -> Conflict | None:
    return _slug_taken() if "slug" in constraint else None


def _slug_taken() -> Conflict:
    return Conflict.over_field(
        "slug", "An automation already has this slug.", code="automation_slug_taken"
    )


def _raise_if(errors: dict[str, list[str]]) -> None:
    if errors:
        raise InvalidInput(details=errors)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# A worker calls the hub every few seconds while it runs; writing its row on every call
# would make each call a write on one hot row. Once in a while is enough.
WORKER_SEEN_INTERVAL = timedelta(seconds=10)


def worker_seen(*, worker_id: int) -> bool:
    """Record that the worker called the hub: ``last_seen_at``, and ``online``.

    One conditional UPDATE outside any job transaction, skipped when the row was written
    recently, so a worker's calls never queue up behind each other on its row.
    """
    now = timezone.now()
    return bool(
        Worker.objects.filter(pk=worker_id, is_active=True)
        .filter(
            Q(last_seen_at__isnull=True)
            | Q(last_seen_at__lt=now - WORKER_SEEN_INTERVAL)
            | ~Q(status=Worker.Status.ONLINE)
        )
        .update(last_seen_at=now, status=Worker.Status.ONLINE, updated_at=now)
    )
