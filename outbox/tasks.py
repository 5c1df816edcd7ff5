"""The outbox's own background tasks (imported by the worker only)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.db import connection, transaction

from outbox.handlers import TaskMessage, task
from outbox.models import OutboxMessage, PlatformOutboxMessage

logger = logging.getLogger("hubdommed.outbox")

# Sent rows are kept this long (for an operator looking into a delivery), then deleted.
RETENTION = timedelta(days=7)
# Rows deleted per statement: each batch is its own short transaction, so no lock is
# held for long and the relay never waits behind the purge.
PURGE_BATCH_SIZE = 1000

# The sent-rows index (outbox_messages_sent_idx, platform_outbox_sent_idx) serves the
# inner query. SKIP LOCKED: a row being re-armed for a retry right now is left alone.
# sent_at IS NOT NULL is what keeps a pending row safe, whatever its age.
_PURGE_BATCH = """
    DELETE FROM {table}
     WHERE id IN (SELECT id FROM {table}
                   WHERE sent_at IS NOT NULL
                     AND sent_at < clock_timestamp() - %s * interval '1 second'
                   ORDER BY sent_at
                   LIMIT %s
                     FOR UPDATE SKIP LOCKED)
"""


def outbox_purge(
    *, older_than: timedelta = RETENTION, batch_size: int = PURGE_BATCH_SIZE
) -> dict[str, int]:
    """Delete the outbox rows of both tables sent more than ``older_than`` ago, in batches.

    Never a pending row. Returns the number of rows deleted per table.
    """
    deleted: dict[str, int] = {}
    for model in (OutboxMessage, PlatformOutboxMessage):
        table = model._meta.db_table
        total = 0
        while True:
            with transaction.atomic(), connection.cursor() as cursor:
                cursor.execute(
                    _PURGE_BATCH.format(table=table), [older_than.total_seconds(), batch_size]
                )
                count = cursor.rowcount
            total += count
            if count < batch_size:
                break
        deleted[table] = total
    return deleted


@task("maintenance.purge")
def purge(message: TaskMessage) -> None:
    deleted = outbox_purge()
    logger.info(
        "outbox purge: %s",
        " ".join(f"{table}={count}" for table, count in deleted.items()),
    )
