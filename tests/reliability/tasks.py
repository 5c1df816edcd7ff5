"""The reliability scenarios' own task (catalogued by them, never in tasks.json).

``chaos.effect`` records each execution as it starts (``reliability_executions``, one row
per execution, committed at once), works for the time its payload says, then applies its
effect the way a well-behaved handler does under at-least-once delivery: keyed by the
run id (``reliability_effects``), so a second execution of a run finds it done. The
scenario then counts effects (exactly one per run) and executions (how many re-runs the
crashes cost) apart.
"""

from __future__ import annotations

import os
import time

from django.db import connection, transaction

from outbox.handlers import TaskMessage, task

TABLES = """
    CREATE TABLE IF NOT EXISTS reliability_executions (
        id bigserial PRIMARY KEY,
        run_id uuid NOT NULL,
        pid integer NOT NULL,
        receive_count integer NOT NULL,
        started_at timestamptz NOT NULL DEFAULT clock_timestamp()
    );
    CREATE TABLE IF NOT EXISTS reliability_effects (
        run_id uuid PRIMARY KEY,
        applied_at timestamptz NOT NULL DEFAULT clock_timestamp(),
        applications integer NOT NULL DEFAULT 1
    );
"""


@task("chaos.effect")
def effect(message: TaskMessage) -> None:
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO reliability_executions (run_id, pid, receive_count) VALUES (%s, %s, %s)",
            [message.run_id, os.getpid(), message.receive_count],
        )
    time.sleep(float(message.payload.get("sleep", 0)))
    with transaction.atomic(), connection.cursor() as cursor:
        # An effect already applied is counted, not repeated: the count shows a run that
        # slipped past the runtime's claim twice.
        cursor.execute(
            """
            INSERT INTO reliability_effects (run_id) VALUES (%s)
            ON CONFLICT (run_id) DO UPDATE
               SET applications = reliability_effects.applications + 1
            """,
            [message.run_id],
        )
