"""Periodic tasks (``tasks.json`` "schedules"), put on the platform outbox by the relay."""

from __future__ import annotations

import math
from datetime import timedelta

from django.db import connection, transaction

from outbox.catalog import Catalog, get_catalog
from outbox.models import clock_timestamp
from outbox.services import dispatch
from relay.models import RelaySchedule


def enqueue_due_schedules(catalog: Catalog | None = None) -> list[str]:
    """Dispatch every schedule whose time has come; return their names.

    At most once per period whatever the number of relays: the schedule's row is
    locked (SKIP LOCKED: another relay got there first) and moved to its next slot in
    the transaction that writes the outbox row. A relay that was down for several
    periods enqueues the task once, not once per missed period.
    """
    catalog = catalog or get_catalog()
    schedules = {schedule.name: schedule for schedule in catalog.schedules}
    if not schedules:
        return []
    with connection.cursor() as cursor:
        # A new schedule is due at once.
        cursor.execute(
            "INSERT INTO relay_schedules (name, next_due_at) "
            "SELECT unnest(%s::text[]), clock_timestamp() ON CONFLICT (name) DO NOTHING",
            [list(schedules)],
        )
    enqueued = []
    with transaction.atomic():
        due = list(
            RelaySchedule.objects.select_for_update(skip_locked=True)
            .filter(name__in=list(schedules), next_due_at__lte=clock_timestamp())
            .order_by("name")
        )
        if not due:
            return []
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            (now,) = cursor.fetchone()
        for row in due:
            schedule = schedules[row.name]
            row.last_run_id = dispatch(schedule.task, schedule.payload)
            periods = math.floor((now - row.next_due_at).total_seconds() / schedule.every_seconds)
            row.next_due_at += (periods + 1) * timedelta(seconds=schedule.every_seconds)
            row.save(update_fields=["next_due_at", "last_run_id"])
            enqueued.append(row.name)
    return enqueued


def schedules_make_due(*, names: list[str]) -> int:
    """An operator's "run now": the schedules become due, and the relay's next sweep
    dispatches them (once, whatever the number of relays). Returns how many there were."""
    return RelaySchedule.objects.filter(name__in=names).update(next_due_at=clock_timestamp())
