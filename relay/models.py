"""The relay's own state: when each periodic task of ``tasks.json`` is next due."""

from __future__ import annotations

from django.db import models


class RelaySchedule(models.Model):
    """One periodic task. The relay that locks the row (SKIP LOCKED) and finds it due
    dispatches the task and moves ``next_due_at`` on in the same transaction, so two
    relays never enqueue one period twice."""

    name = models.TextField(primary_key=True)
    next_due_at = models.DateTimeField()
    # The run enqueued last, for an operator following it in task_runs.
    last_run_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "relay_schedules"

    def __str__(self) -> str:
        return f"{self.name} due {self.next_due_at:%Y-%m-%d %H:%M:%S}"
