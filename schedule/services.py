"""Use cases of schedules: each one transaction.

People create, change, pause, resume and deactivate their tenant's schedules; the firing
(``schedules_fire_due``, the step of ``manage.py run_scheduler``) starts one job per due
time through ``job.services.job_create``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from automation.selectors import automation_get
from common.errors import Conflict, DomainError, InvalidInput, NotFound
from job.services import job_create, job_params_check
from schedule import calendar
from schedule.models import Misfire, Schedule, ScheduleRun

logger = logging.getLogger("hubdommed.schedule")

NAME_MAX_LENGTH = 200
# The fields a person may change (the automation is fixed: another one is another schedule).
UPDATABLE = ("name", "cron", "timezone", "params", "misfire")
PAUSED_BY_PERSON = "Paused by a manager."
RUN_CONSTRAINT = "schedule_runs_schedule_due_at_key"


# --- people -----------------------------------------------------------------------------


@transaction.atomic
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
    first due time after now."""
    params = {} if params is None else params
    check_fields({"name": name, "cron": cron, "timezone": timezone_name, "misfire": misfire})
    automation = automation_get(automation_id)
    if automation is None:
        raise InvalidInput(
            "There is no such automation.",
            code="unknown_automation",
            details={"automation": ["There is no such automation."]},
        )
    if not automation.is_active:
        raise Conflict("The automation is inactive.", code="automation_inactive")
    job_params_check(params, schema=automation.params_schema, automation_id=automation.id)

    now = timezone.now()
    schedule = Schedule(
        tenant=tenant,
        automation_id=automation.id,
        created_by=actor,
        # Unnamed, it is known by its expression.
        name=name.strip() or calendar.normalized(cron),
        cron=calendar.normalized(cron),
        timezone=timezone_name,
        params=params,
        misfire=misfire,
        created_at=now,
        updated_at=now,
    )
    schedule.reschedule(now=now)
    schedule.save(force_insert=True)
    logger.info("schedule %s created for automation %s", schedule.pk, automation.id)
    return schedule


@transaction.atomic
def schedule_update(*, tenant: Any, schedule_id: int, data: Mapping[str, Any]) -> Schedule:
    """Change the given fields; a new calendar takes effect from now (no catching up)."""
    schedule = _locked(tenant, schedule_id)
    schedule.ensure_active()
    changes = {key: data[key] for key in UPDATABLE if key in data}
    check_fields(changes)
    if "params" in changes:
        automation = automation_get(schedule.automation_id)
        job_params_check(
            changes["params"], schema=automation.params_schema, automation_id=automation.id
        )
    if "cron" in changes:
        changes["cron"] = calendar.normalized(changes["cron"])
    if "name" in changes:
        changes["name"] = changes["name"].strip() or changes.get("cron", schedule.cron)
    now = timezone.now()
    calendar_changed = any(
        getattr(schedule, key) != changes[key] for key in ("cron", "timezone") if key in changes
    )
    for key, value in changes.items():
        setattr(schedule, key, value)
    if calendar_changed:
        schedule.reschedule(now=now)
    schedule.updated_at = now
    schedule.save()
    return schedule


@transaction.atomic
def schedule_pause(*, tenant: Any, schedule_id: int) -> Schedule:
    schedule = _locked(tenant, schedule_id)
    now = timezone.now()
    if schedule.pause(now=now, reason=PAUSED_BY_PERSON):
        schedule.updated_at = now
        schedule.save()
    return schedule


@transaction.atomic
def schedule_resume(*, tenant: Any, schedule_id: int) -> Schedule:
    """Run again from the next due time. Params that no longer fit the automation's schema
    are refused here, as they would be at the next run (change them first)."""
    schedule = _locked(tenant, schedule_id)
    schedule.ensure_active(message="The schedule is deactivated: it cannot be resumed.")
    automation = automation_get(schedule.automation_id)
    if not automation.is_active:
        raise Conflict("The automation is inactive.", code="automation_inactive")
    job_params_check(schedule.params, schema=automation.params_schema, automation_id=automation.id)
    now = timezone.now()
    if schedule.resume(now=now):
        schedule.updated_at = now
        schedule.save()
    return schedule


@transaction.atomic
def schedule_deactivate(*, tenant: Any, schedule_id: int) -> Schedule:
    schedule = _locked(tenant, schedule_id)
    now = timezone.now()
    schedule.end(now=now, reason="Deactivated by a manager.")
    schedule.updated_at = now
    schedule.save()
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


def check_fields(fields: Mapping[str, Any]) -> None:
    errors: dict[str, list[str]] = {}
    if "name" in fields:
        name = fields["name"]
        if not isinstance(name, str):
            errors["name"] = ["Must be text."]
        elif len(name.strip()) > NAME_MAX_LENGTH:
            errors["name"] = [f"At most {NAME_MAX_LENGTH} characters."]
    if "cron" in fields and (problem := calendar.cron_problem(fields["cron"])):
        errors["cron"] = [problem]
    if "timezone" in fields and (problem := calendar.zone_problem(fields["timezone"])):
        errors["timezone"] = [problem]
    if "misfire" in fields and fields["misfire"] not in Misfire.values:
        errors["misfire"] = [f"Must be one of: {', '.join(Misfire.values)}."]
    if not errors:
        return
    if len(errors) == 1:
        (field_name,) = errors
        raise InvalidInput(errors[field_name][0], code=f"invalid_{field_name}", details=errors)
    raise InvalidInput("The schedule is invalid.", code="invalid", details=errors)


# --- the firing -------------------------------------------------------------------------


@dataclass
class Firing:
    """What one batch of the firing did."""

    # Jobs started, one per schedule at most.
    started: list[int] = field(default_factory=list)
    # Schedules paused or deactivated instead of running.
    stopped: list[int] = field(default_factory=list)
    # Whether the batch was full: more schedules may be due right away.
    more: bool = False


def misfire_grace() -> timedelta:
    return timedelta(seconds=settings.SCHEDULE_MISFIRE_GRACE_SECONDS)


def schedules_fire_due(*, now: datetime | None = None, batch_size: int = 100) -> Firing:
    """Start a job for each schedule whose next run has come, one batch, one transaction.

    SKIP LOCKED keeps two firings (two workers, or a firing that outlived its message's
    visibility) from taking the same schedule; the unique key on (schedule, due time)
    keeps a due time from starting a second job whatever else happens (a clock that went
    back, a schedule moved back by hand). Each schedule moves to its first due time after
    ``now`` in the same transaction as its job, so a hub that was down for hours starts at
    most one late run per schedule (``run_once``), or none (``skip``): never a burst.
    """
    now = now or timezone.now()
    firing = Firing()
    with transaction.atomic():
        due = list(
            Schedule.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("tenant", "automation")
            .filter(next_run_at__lte=now)
            .order_by("next_run_at", "id")[:batch_size]
        )
        for schedule in due:
            _fire(schedule, now=now, firing=firing)
    firing.more = len(due) == batch_size
    return firing


def _fire(schedule: Schedule, *, now: datetime, firing: Firing) -> None:
    if not schedule.tenant.is_active:
        schedule.end(now=now, reason="Its tenant was deactivated.")
    elif not schedule.automation.is_active:
        schedule.end(now=now, reason="Its automation was deactivated.")
    else:
        _run_latest_due(schedule, now=now, firing=firing)
    try:
        schedule.reschedule(now=now)
    except calendar.UNREADABLE as exc:
        _pause_unreadable(schedule, now=now, exc=exc)
    if not schedule.is_active or schedule.is_paused:
        firing.stopped.append(schedule.pk)
    schedule.updated_at = now
    schedule.save()


def _run_latest_due(schedule: Schedule, *, now: datetime, firing: Firing) -> None:
    try:
        due_at = calendar.latest_due_between(
            schedule.cron, schedule.timezone, since=schedule.next_run_at, until=now
        )
    except calendar.UNREADABLE as exc:
        _pause_unreadable(schedule, now=now, exc=exc)
        return
    if due_at is None:
        return  # moved to a calendar whose due time has not come (an edit in the admin)
    if schedule.misfire == Misfire.SKIP and now - due_at > misfire_grace():
        logger.info("schedule %s: the run due %s was missed; skipped", schedule.pk, due_at)
        return
    _start(schedule, due_at=due_at, now=now, firing=firing)


def _pause_unreadable(schedule: Schedule, *, now: datetime, exc: Exception) -> None:
    # A row the API would have refused (changed in the database, or a zone the time zone
    # database dropped): paused with the reason, so that it does not fail every cycle.
    logger.error("schedule %s paused: its calendar cannot be read: %s", schedule.pk, exc)
    schedule.pause(now=now, reason=f"Its calendar cannot be read: {exc}")


def _start(schedule: Schedule, *, due_at: datetime, now: datetime, firing: Firing) -> None:
    try:
        # A savepoint: a refused job or a due time already taken leaves nothing behind,
        # and the schedule still moves on.
        with transaction.atomic():
            job, _ = job_create(
                tenant=schedule.tenant,
                automation_id=schedule.automation_id,
                params=schedule.params,
                requested_by=None,
                triggered_by=schedule.triggered_by(due_at),
            )
            ScheduleRun.objects.create(schedule=schedule, due_at=due_at, job_id=job.pk)
    except IntegrityError as exc:
        if _constraint_of(exc) != RUN_CONSTRAINT:
            raise
        # Another firing already started this due time.
        logger.info("schedule %s: the run due %s was already started", schedule.pk, due_at)
        return
    except DomainError as refusal:
        reason = _refusal_reason(refusal)
        logger.warning("schedule %s paused: %s", schedule.pk, reason)
        schedule.pause(now=now, reason=reason)
        return
    schedule.ran(due_at=due_at)
    firing.started.append(job.pk)


def _constraint_of(exc: IntegrityError) -> str | None:
    diag = getattr(exc.__cause__, "diag", None)
    return getattr(diag, "constraint_name", None)


def _refusal_reason(refusal: DomainError) -> str:
    reason = f"The run was refused ({refusal.code}): {refusal.message}"
    problems = refusal.details.get("params") or refusal.details.get("params_schema")
    if problems:
        reason += f" {problems}"
    return reason


# --- schedules whose automation or tenant ended ------------------------------------------


@transaction.atomic
def schedules_end_orphaned() -> list[int]:
    """Deactivate the schedules whose automation or tenant was deactivated.

    The firing refuses them at their next due time anyway; this makes them read as
    stopped at once, whatever their calendar.
    """
    now = timezone.now()
    ended = []
    orphaned = (
        Schedule.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("tenant", "automation")
        .filter(is_active=True)
        .filter(Q(automation__is_active=False) | Q(tenant__is_active=False))
        .order_by("id")
    )
    for schedule in orphaned:
        reason = (
            "Its tenant was deactivated."
            if not schedule.tenant.is_active
            else "Its automation was deactivated."
        )
        schedule.end(now=now, reason=reason)
        schedule.updated_at = now
        schedule.save()
        ended.append(schedule.pk)
    return ended
