"""Schedules: a tenant's calendar of runs of an automation, and the runs it started.

The ``Schedule`` aggregate owns its transitions (``pause``, ``resume``, ``end``,
``reschedule``); ``schedule.services`` and ``schedule.firing`` compute the calendar first,
then lock the row briefly, call them and save. A ``ScheduleRun`` is one due time that
started a job: its unique key on (schedule, due time) is what makes a due time start one
job, whoever fires it and however often.

A schedule's states and their ways forward:

* ``deactivated`` is final (a person's decision, or its automation's or tenant's end;
  ``deactivated_reason`` says which).
* ``active`` moves by ``next_run_at`` and the scheduler's cycle, which starts the due
  runs and sets the next due time in the same transaction. An active schedule always has
  a ``next_run_at``: a calendar with no due time within the search's bound is paused
  instead, with the reason. ``schedule.stranded`` finds the rows that break this.
* ``paused`` moves by a person's resume; ``paused_reason`` says why it stopped (a person,
  params the automation's schema refuses, a calendar that cannot be read).
"""

from __future__ import annotations

from datetime import datetime

from django.conf import settings
from django.db import models
from django.db.models import Q

# The module, not the field of that name below.
from django.utils import timezone as django_timezone

from common.jsondata import storable_text
from common.models import Deactivatable, choices_check


class Misfire(models.TextChoices):
    # Runs missed while the hub was down: only the latest of them starts, late.
    RUN_ONCE = "run_once"
    # Runs missed while the hub was down are dropped; the next due time is awaited.
    SKIP = "skip"


class Schedule(Deactivatable):
    Misfire = Misfire

    inactive_message = "The schedule is deactivated; it can no longer change."
    inactive_code = "schedule_inactive"

    id = models.BigAutoField(primary_key=True)
    tenant = models.ForeignKey("identity.Tenant", on_delete=models.PROTECT, related_name="+")
    automation = models.ForeignKey(
        "automation.Automation", on_delete=models.PROTECT, related_name="+"
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.PROTECT, related_name="+"
    )
    name = models.TextField()
    # Five fields, single-spaced; read in ``timezone``.
    cron = models.TextField()
    timezone = models.TextField(default="UTC")
    params = models.JSONField(default=dict)
    misfire = models.TextField(choices=Misfire.choices, default=Misfire.RUN_ONCE)
    paused_at = models.DateTimeField(null=True, blank=True)
    # Why it is paused: a person's pause, or the hub's (params that no longer fit the schema).
    paused_reason = models.TextField(blank=True, default="")
    # Why it was deactivated: a person's decision, or its automation's or tenant's end.
    deactivated_reason = models.TextField(blank=True, default="")
    # The next due time, UTC; null while paused or deactivated (nothing will run).
    next_run_at = models.DateTimeField(null=True, blank=True)
    # The latest due time that started a job.
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=django_timezone.now)
    updated_at = models.DateTimeField(default=django_timezone.now)

    class Meta:
        db_table = "schedules"
        constraints = [
            choices_check("schedules", "misfire", Misfire),
            # The firing query relies on it: only a running schedule has a next run.
            models.CheckConstraint(
                condition=Q(next_run_at__isnull=True) | Q(is_active=True, paused_at__isnull=True),
                name="schedules_next_run_only_when_running_check",
            ),
        ]
        indexes = [
            # The firing query: due schedules, earliest first. Partial: paused and
            # deactivated schedules have no next run and are not in it.
            models.Index(
                fields=["next_run_at"],
                condition=Q(next_run_at__isnull=False),
                name="schedules_due_idx",
            ),
            # GET /schedules: a tenant's schedules by id.
            models.Index(fields=["tenant", "id"], name="schedules_tenant_idx"),
            # Deactivating an automation stops its schedules.
            models.Index(
                fields=["automation"], condition=Q(is_active=True), name="schedules_automation_idx"
            ),
        ]

    def __str__(self) -> str:
        return f"schedule {self.pk} {self.name!r} ({self.cron} {self.timezone})"

    @property
    def is_paused(self) -> bool:
        return self.paused_at is not None

    @property
    def status(self) -> str:
        if not self.is_active:
            return "deactivated"
        return "paused" if self.is_paused else "active"

    # --- transitions ------------------------------------------------------------------

    def reschedule(self, *, next_run_at: datetime) -> None:
        """Wait for ``next_run_at`` (computed by the caller, before it took the row's lock)
        when the schedule runs; nothing is awaited otherwise."""
        self.next_run_at = next_run_at if self.is_active and not self.is_paused else None

    def pause(self, *, now: datetime, reason: str) -> bool:
        """Stop firing until resumed. Pausing a paused schedule changes nothing (False)."""
        self.ensure_active(message="The schedule is deactivated: it cannot be paused.")
        if self.is_paused:
            return False
        self.paused_at = now
        # It may quote outside text (a calendar library's message): storable, or the
        # pause itself fails and the schedule neither pauses nor moves on.
        self.paused_reason = storable_text(reason)
        self.next_run_at = None
        return True

    def resume(self, *, next_run_at: datetime) -> bool:
        """Fire again from ``next_run_at``, the first due time after now: what fell due
        while paused is not a misfire."""
        self.ensure_active(message="The schedule is deactivated: it cannot be resumed.")
        if not self.is_paused:
            return False
        self.paused_at = None
        self.paused_reason = ""
        self.reschedule(next_run_at=next_run_at)
        return True

    def end(self, *, now: datetime, reason: str) -> None:
        """Deactivate for good (a person's decision, or its automation's or tenant's end)."""
        self.deactivate(now=now)
        self.deactivated_reason = storable_text(reason)
        self.next_run_at = None

    def calendar_key(self) -> tuple[str, str, str, datetime | None]:
        """What a due-time computation read: a firing applies its result only to a row that
        still has it."""
        return (self.cron, self.timezone, self.misfire, self.next_run_at)

    def ran(self, *, due_at: datetime) -> None:
        self.last_run_at = due_at if self.last_run_at is None else max(self.last_run_at, due_at)

    def triggered_by(self, due_at: datetime) -> dict[str, object]:
        """What a job it starts records about its origin."""
        return {"schedule": int(self.pk), "due_at": due_at.isoformat()}


class ScheduleRun(models.Model):
    """One due time of a schedule that started a job."""

    id = models.BigAutoField(primary_key=True)
    schedule = models.ForeignKey(Schedule, on_delete=models.PROTECT, related_name="runs")
    due_at = models.DateTimeField()
    job = models.ForeignKey("job.Job", on_delete=models.PROTECT, related_name="+")
    created_at = models.DateTimeField(default=django_timezone.now)

    class Meta:
        db_table = "schedule_runs"
        constraints = [
            # One job per due time, whatever fires it (two workers, a restart, a clock
            # that went back): the firing catches the violation and moves on.
            models.UniqueConstraint(
                fields=["schedule", "due_at"], name="schedule_runs_schedule_due_at_key"
            ),
        ]

    def __str__(self) -> str:
        return f"run of schedule {self.schedule_id} due {self.due_at.isoformat()}"
