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


def probe_row_locks(monkeypatch, ids: list[int] | None = None) -> list[str]:
    """Each parameter check first tries to lock schedules' rows from another connection,
    without waiting (those of ``ids`` once it is filled, nothing before; every row without
    ``ids``): what it found, free or locked, is kept, in order, in the list returned."""
    from job import services as job_services

    found: list[str] = []
    check = job_services.params_errors

    def probing(params, schema):
        if ids is None or ids:
            with other_connection() as other:
                try:
                    if ids is None:
                        other.execute("SELECT id FROM schedules FOR UPDATE NOWAIT")
                    else:
                        other.execute(
                            "SELECT id FROM schedules WHERE id = ANY(%s) FOR UPDATE NOWAIT",
                            [ids],
                        )
                    found.append("free")
                except psycopg.errors.LockNotAvailable:
                    found.append("locked")
                other.rollback()
        return check(params, schema)

    monkeypatch.setattr(job_services, "params_errors", probing)
    return found
