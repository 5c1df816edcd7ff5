"""Use cases of schedules that people start: each one short transaction.

People create, change, pause, resume and deactivate their tenant's schedules. A calendar is
computed before the row is locked (it is bounded, but a lock is not held for it): the row
is read, the next due time computed, then the row is locked and changed; when someone else
changed its calendar meanwhile, the computation is done again under the lock. The firing
(``schedule.firing``) starts the jobs. A change that gives a schedule a next due time (a
creation, a new calendar, a resume) wakes the sleeping scheduler when it commits
(``schedule.wake``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from automation.selectors import automation_get
from common.errors import Conflict, InvalidInput, NotFound
from identity.selectors import tenant_is_active
from job.services import job_automation_check, job_params_check
from schedule import calendar
from schedule.models import Misfire, Schedule
from schedule.wake import wake_scheduler_on_commit

logger = logging.getLogger("hubdommed.schedule")

NAME_MAX_LENGTH = 200
# The fields a person may change (the automation is fixed: another one is another schedule).
UPDATABLE = ("name", "cron", "timezone", "params", "misfire")
PAUSED_BY_PERSON = "Paused by a manager."
# Advisory-lock namespace of a tenant's schedule creations (pg_advisory_xact_lock(int, int)).
CREATE_LOCK_NAMESPACE = 0x736368  # "sch"


# --- people -----------------------------------------------------------------------------


def schedule_create(
    *,
    tenant: Any,
    actor: Any,
    automation_id: int,
    cron: str,
    name: str = "",
    timezone_name: str = "UTC",
    params: dict[str, Any] | None = None,
    misfire: str = Misfire.RUN_ONCE,
) -> Schedule:
    """A running schedule of ``tenant`` on an active automation; its first run is the
    first due time after now. A tenant has at most ``SCHEDULE_MAX_PER_TENANT`` schedules
    that are not deactivated."""
    params = {} if params is None else params
    check_fields({"name": name, "cron": cron, "timezone": timezone_name, "misfire": misfire})
    automation = job_automation_check(automation_id=automation_id, params=params)

    now = timezone.now()
    expression = calendar.normalized(cron)
    first_run = first_due_after(expression, timezone_name, now)
    with transaction.atomic():
        _hold_within_limit(tenant)
        # The API's callers are people of an active tenant already; the admin's are not.
        if not tenant_is_active(tenant.pk):
            raise Conflict("The tenant is deactivated.", code="tenant_inactive")
        schedule = Schedule(
            tenant=tenant,
            automation_id=automation.id,
            created_by=actor,
            # Unnamed, it is known by its expression.
            name=name.strip() or expression,
            cron=expression,
            timezone=timezone_name,
            params=params,
            misfire=misfire,
            created_at=now,
            updated_at=now,
        )
        schedule.reschedule(next_run_at=first_run)
        schedule.save(force_insert=True)
        wake_scheduler_on_commit()
    logger.info("schedule %s created for automation %s", schedule.pk, automation.id)
    return schedule


def _hold_within_limit(tenant: Any) -> None:
    """Serialize the tenant's creations until the transaction ends, and refuse one past
    the limit. The lock makes the count and the insert one step: two creations at once
    cannot both take the last place."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_advisory_xact_lock(%s, %s)", [CREATE_LOCK_NAMESPACE, tenant.pk % 2**31]
        )
    limit = settings.SCHEDULE_MAX_PER_TENANT
    if Schedule.objects.filter(tenant=tenant, is_active=True).count() >= limit:
        raise Conflict(
            f"The tenant has {limit} schedules, its limit: deactivate one first.",
            code="schedule_limit_reached",
            details={"limit": limit},
        )


def schedule_update(*, tenant: Any, schedule_id: int, data: Mapping[str, Any]) -> Schedule:
    """Change the given fields; a new calendar takes effect from now (no catching up)."""
    current = _read(tenant, schedule_id)
    current.ensure_active()
    changes = {key: data[key] for key in UPDATABLE if key in data}
    check_fields(changes, cron=current.cron, zone=current.timezone)
    if "params" in changes:
        automation = automation_get(current.automation_id)
        job_params_check(
            changes["params"], schema=automation.params_schema, automation_id=automation.id
        )
    if "cron" in changes:
        changes["cron"] = calendar.normalized(changes["cron"])
    if "name" in changes:
        changes["name"] = changes["name"].strip() or changes.get("cron", current.cron)
    now = timezone.now()
    cron = changes.get("cron", current.cron)
    zone = changes.get("timezone", current.timezone)
    calendar_changed = (cron, zone) != (current.cron, current.timezone)
    next_run = first_due_after(cron, zone, now) if calendar_changed else None

    with transaction.atomic():
        schedule = _locked(tenant, schedule_id)
        schedule.ensure_active()
        moved_meanwhile = (schedule.cron, schedule.timezone) != (current.cron, current.timezone)
        for key, value in changes.items():
            setattr(schedule, key, value)
        if calendar_changed or moved_meanwhile:
            if moved_meanwhile:
                # Another change of the calendar landed meanwhile: computed again (bounded).
                next_run = first_due_after(schedule.cron, schedule.timezone, now)
            schedule.reschedule(next_run_at=next_run)
            wake_scheduler_on_commit()
        _save(schedule, now)
    return schedule


@transaction.atomic
def schedule_pause(*, tenant: Any, schedule_id: int) -> Schedule:
    schedule = _locked(tenant, schedule_id)
    now = timezone.now()
    if schedule.pause(now=now, reason=PAUSED_BY_PERSON):
        _save(schedule, now)
    return schedule


def schedule_resume(*, tenant: Any, schedule_id: int) -> Schedule:
    """Run again from the next due time. Params that no longer fit the automation's schema
    are refused here, as they would be at the next run (change them first), and so is a
    calendar that has no due time left (change it first)."""
    current = _read(tenant, schedule_id)
    current.ensure_active(message="The schedule is deactivated: it cannot be resumed.")
    now = timezone.now()
    next_run = first_due_after(current.cron, current.timezone, now) if current.is_paused else None
    if current.is_paused:
        # Before the lock: the check runs the automation's schema on the params.
        job_automation_check(automation_id=current.automation_id, params=current.params)
    with transaction.atomic():
        schedule = _locked(tenant, schedule_id)
        schedule.ensure_active(message="The schedule is deactivated: it cannot be resumed.")
        if not schedule.is_paused:
            return schedule
        if not current.is_paused or (schedule.automation_id, schedule.params) != (
            current.automation_id,
            current.params,
        ):
            # Changed between the read and the lock (rare): checked as it is now.
            job_automation_check(automation_id=schedule.automation_id, params=schedule.params)
        if next_run is None or (schedule.cron, schedule.timezone) != (
            current.cron,
            current.timezone,
        ):
            next_run = first_due_after(schedule.cron, schedule.timezone, now)
        schedule.resume(next_run_at=next_run)
        _save(schedule, now)
        wake_scheduler_on_commit()
    return schedule


@transaction.atomic
def schedule_deactivate(*, tenant: Any, schedule_id: int) -> Schedule:
    schedule = _locked(tenant, schedule_id)
    now = timezone.now()
    schedule.end(now=now, reason="Deactivated by a manager.")
    _save(schedule, now)
    return schedule


def first_due_after(cron: str, zone: str, now: datetime) -> datetime:
    """The first due time after ``now``, or the 400 a person gets when there is none
    within the calendar's bound, or the stored calendar or zone cannot be read."""
    try:
        return calendar.next_due_after(cron, zone, now)
    except calendar.UNREADABLE as exc:
        # A zone that passed when it was taken and this server cannot read now is the
        # zone's fault, not the expression's.
        field = "timezone" if isinstance(exc, calendar.ZoneError) else "cron"
        raise InvalidInput(
            f"The schedule has no due time: {exc}.",
            code=f"invalid_{field}",
            details={field: [f"No due time: {exc}."]},
        ) from exc


def _save(schedule: Schedule, now: datetime) -> None:
    schedule.updated_at = now
    schedule.save()


def _read(tenant: Any, schedule_id: int) -> Schedule:
    schedule = Schedule.objects.filter(tenant=tenant, pk=schedule_id).first()
    if schedule is None:
        raise NotFound("There is no such schedule.", code="schedule_not_found")
    return schedule


def _locked(tenant: Any, schedule_id: int) -> Schedule:
    schedule = (
        Schedule.objects.select_for_update(of=("self",))
        .filter(tenant=tenant, pk=schedule_id)
        .first()
    )
    if schedule is None:
        raise NotFound("There is no such schedule.", code="schedule_not_found")
    return schedule


def check_fields(
    fields: Mapping[str, Any], *, cron: str | None = None, zone: str | None = None
) -> None:
    """Refuse what a schedule cannot hold, field by field; ``cron`` and ``zone`` are the
    schedule's current calendar, for a change of only one of them."""
    errors: dict[str, list[str]] = {}
    if "name" in fields:
        name = fields["name"]
        if not isinstance(name, str):
            errors["name"] = ["Must be text."]
        elif len(name.strip()) > NAME_MAX_LENGTH:
            errors["name"] = [f"At most {NAME_MAX_LENGTH} characters."]
    if "timezone" in fields and (problem := calendar.zone_problem(fields["timezone"])):
        errors["timezone"] = [problem]
    if "cron" in fields or ("timezone" in fields and "timezone" not in errors):
        # A calendar is read in its zone: a new zone can leave an expression with no due time.
        expression = fields.get("cron", cron)
        in_zone = fields.get("timezone", zone) if "timezone" not in errors else "UTC"
        if expression is not None and (
            problem := calendar.cron_problem(expression, in_zone or "UTC")
        ):
            errors["cron"] = [problem]
    if "misfire" in fields and fields["misfire"] not in Misfire.values:
        errors["misfire"] = [f"Must be one of: {', '.join(Misfire.values)}."]
    if not errors:
        return
    if len(errors) == 1:
        (field_name,) = errors
        raise InvalidInput(errors[field_name][0], code=f"invalid_{field_name}", details=errors)
    # Several at once: the code names the first of them in the order a reader fixes them
    # (the zone first, in which the expression is read), so that a client keyed on the
    # documented codes (invalid_timezone, invalid_cron) still finds one; details has them all.
    first = next(name for name in _FIELD_ORDER if name in errors)
    raise InvalidInput(
        f"The schedule is invalid: {', '.join(sorted(errors))}.",
        code=f"invalid_{first}",
        details=errors,
    )


_FIELD_ORDER = ("timezone", "cron", "name", "misfire")
