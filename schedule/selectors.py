"""Reads of schedules: always within the caller's tenant."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from common.errors import NotFound
from schedule.models import Schedule


def schedule_list(
    *, tenant_id: int, active: bool | None = None, automation_id: int | None = None
) -> QuerySet[Schedule]:
    schedules = Schedule.objects.filter(tenant_id=tenant_id)
    if active is not None:
        schedules = schedules.filter(is_active=active)
    if automation_id is not None:
        schedules = schedules.filter(automation_id=automation_id)
    return schedules.order_by("id")


def schedule_get(*, tenant_id: int, schedule_id: int) -> Schedule:
    """The tenant's schedule; another tenant's is as absent as one that never was."""
    schedule = Schedule.objects.filter(tenant_id=tenant_id, pk=schedule_id).first()
    if schedule is None:
        raise NotFound("There is no such schedule.", code="schedule_not_found")
    return schedule


def schedule_runs(*, schedule: Any, limit: int = 20) -> QuerySet:
    """A schedule's latest runs (due time and job), newest first."""
    return schedule.runs.order_by("-due_at")[:limit]
