"""The schedules' figures on the admin's front page, and a job's schedule: read-only."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from schedule.models import Schedule, ScheduleRun

# Paused schedules named on the front page (the count says how many in all).
SHOWN = 10


@dataclass(frozen=True)
class PausedSchedule:
    id: int
    name: str
    reason: str
    paused_at: datetime


def schedules_paused() -> tuple[int, list[PausedSchedule]]:
    """How many active schedules are paused, and the latest paused of them with why."""
    paused = Schedule.objects.filter(is_active=True, paused_at__isnull=False)
    shown = [
        PausedSchedule(pk, name, reason, paused_at)
        for pk, name, reason, paused_at in paused.order_by("-paused_at").values_list(
            "pk", "name", "paused_reason", "paused_at"
        )[:SHOWN]
    ]
    return paused.count(), shown


@dataclass(frozen=True)
class JobOrigin:
    schedule_id: int
    schedule_name: str
    due_at: datetime


def job_origin(job_id: int) -> JobOrigin | None:
    """The schedule whose due time started the job (None: someone asked for it)."""
    run = ScheduleRun.objects.filter(job_id=job_id).select_related("schedule").first()
    if run is None:
        return None
    return JobOrigin(run.schedule_id, run.schedule.name, run.due_at)
