"""Helpers of the schedules tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import psycopg
from django.db import connection

from job.models import Job
from schedule.models import Schedule
from schedule.services import schedule_create


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def new_schedule(*, tenant, automation, actor=None, **fields: Any) -> Schedule:
    fields.setdefault("name", "nightly")
    fields.setdefault("cron", "0 6 * * *")
    fields.setdefault("params", {"name": "Ada"})
    return schedule_create(tenant=tenant, actor=actor, automation_id=automation.pk, **fields)


def jobs_of(schedule: Schedule) -> list[Job]:
    return list(Job.objects.filter(triggered_by__schedule=schedule.pk).order_by("id"))


def due_times_of(schedule: Schedule) -> list[datetime]:
    return [datetime.fromisoformat(job.triggered_by["due_at"]) for job in jobs_of(schedule)]


def other_connection() -> psycopg.Connection:
    """A connection of its own to the test database, beside Django's (a lock held there is
    another transaction's)."""
    params = connection.get_connection_params()
    return psycopg.connect(
        **{key: params[key] for key in ("dbname", "host", "port", "user") if key in params}
    )
