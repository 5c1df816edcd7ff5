"""The ways-forward check of schedules (``common.ways_forward``, machine ``schedules``).

An active, unpaused schedule moves by its ``next_run_at`` and the scheduler's cycle. Two
kinds of row break that, and the check gives each its way forward again:

* running with no ``next_run_at`` (changed in the database, or left so by a defect): no
  scheduler will ever take it. Its next due time is computed and set; a calendar that has
  none (unreadable, or no due time within the search's bound) pauses it with the reason.
  No transaction of the hub commits this state, so there is no margin to wait.
* running with a ``next_run_at`` long past (``overdue_after``) that no scheduler took,
  while a scheduler is running: one started a run since this row fell due, yet left it.
  It is fired as the scheduler would (the same plan, its parameters checked before any
  lock with the scheduler's bounds, and SKIP LOCKED, so a scheduler that takes it at the
  same moment is not raced), which starts what is due within the grace, applies
  ``misfire`` to the rest and sets the next due time. A row whose parameters the check's
  time had no room for is left to the next check. When no scheduler is
  running, every due row is late and none is stranded: that outage shows on the
  scheduler's own heartbeat, and this check does not stand in for it.

Rows another transaction holds are skipped: they are in someone's hands.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from common.ways_forward import Repaired
from schedule import calendar
from schedule.firing import PLANNED_FIELDS, ParamsChecks, schedules_fire_planned, schedules_plan
from schedule.models import Schedule, ScheduleRun

# Rows one check repairs at most (the next cycle takes the rest).
BATCH = 100


def overdue_after() -> timedelta:
    """How late a due schedule is before it counts as passed over: well past the grace
    and many scheduler cycles, so that a busy scheduler's backlog is not taken for it."""
    return max(
        timedelta(minutes=10),
        2 * timedelta(seconds=settings.SCHEDULE_MISFIRE_GRACE_SECONDS),
        100 * timedelta(seconds=settings.SCHEDULER_INTERVAL_SECONDS),
    )


def schedules_stranded() -> list[Repaired]:
    now = timezone.now()
    return _without_next_run(now) + _passed_over(now)


def _running():
    return Schedule.objects.filter(is_active=True, paused_at__isnull=True)


def _without_next_run(now: datetime) -> list[Repaired]:
    stranded = list(
        _running()
        .filter(next_run_at__isnull=True)
        .order_by("id")
        .only("id", "cron", "timezone")[:BATCH]
    )
    # Computed before any lock is taken (bounded, but a lock is never held for it).
    answers: dict[int, tuple[tuple[str, str], datetime | None, str | None]] = {}
    for schedule in stranded:
        try:
            next_run = calendar.next_due_after(schedule.cron, schedule.timezone, now)
            answers[schedule.pk] = ((schedule.cron, schedule.timezone), next_run, None)
        except calendar.UNREADABLE as exc:
            answers[schedule.pk] = ((schedule.cron, schedule.timezone), None, str(exc))
    repaired = []
    with transaction.atomic():
        locked = (
            _running()
            .select_for_update(skip_locked=True, of=("self",))
            .filter(pk__in=list(answers), next_run_at__isnull=True)
            .order_by("id")
        )
        for schedule in locked:
            key, next_run, problem = answers[schedule.pk]
            if (schedule.cron, schedule.timezone) != key:
                continue  # its calendar changed meanwhile: the next check computes again
            if problem is None:
                schedule.reschedule(next_run_at=next_run)
                action = f"next run set to {next_run.isoformat()}"
            else:
                schedule.pause(now=now, reason=f"Its calendar cannot be read: {problem}")
                action = f"paused: {schedule.paused_reason}"
            schedule.updated_at = now
            schedule.save()
            repaired.append(Repaired(f"schedule {schedule.pk}", "active with no next run", action))
    return repaired


def _passed_over(now: datetime) -> list[Repaired]:
    late = list(
        Schedule.objects.filter(next_run_at__lt=now - overdue_after())
        .order_by("next_run_at", "id")
        .only(*PLANNED_FIELDS)[:BATCH]
    )
    if not late:
        return []
    # A scheduler is running if it started a run after these fell due (the latest run by
    # the primary key's index: no scan).
    latest = ScheduleRun.objects.order_by("-id").values_list("created_at", flat=True).first()
    late = [
        row for row in late if latest is not None and latest > row.next_run_at + overdue_after()
    ]
    # Planned as the scheduler plans, no lock held: the calendar searched and the runs'
    # parameters checked (a tenant's schema) before each row is locked to fire it.
    checks = ParamsChecks()
    plans = {plan.schedule_id: plan for plan in schedules_plan(late, now=now, checks=checks)}
    repaired = []
    for schedule in late:
        if schedule.pk not in plans:
            continue  # no time left for its parameters' check: the next check fires it
        was_due = schedule.next_run_at
        firing = schedules_fire_planned([plans[schedule.pk]], now=now, checks=checks)
        if not firing.applied:
            continue  # a scheduler holds it, or it changed: it is moving
        schedule.refresh_from_db()
        moved = (
            f"{len(firing.started)} runs started, next run at {schedule.next_run_at.isoformat()}"
            if schedule.next_run_at is not None
            else f"now {schedule.status}: {schedule.paused_reason or schedule.deactivated_reason}"
        )
        repaired.append(
            Repaired(
                f"schedule {schedule.pk}",
                f"due since {was_due.isoformat()} and passed over by the scheduler",
                f"fired: {moved}",
            )
        )
    return repaired
