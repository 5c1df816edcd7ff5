"""How far behind the relay is: rows not sent yet and the age of the oldest due one.

Read by the backlog metrics (``outbox.metrics``) at each scrape, so it must stay cheap
however much history the tables keep: the WHERE clause is the predicate of the partial
pending indexes (``outbox_messages_pending_idx``, ``platform_outbox_pending_idx``), which
include ``available_at``, so both figures come from one scan of the pending rows' index.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection, transaction

from outbox.delivery import TABLES

_BACKLOG = """
    SELECT count(*),
           coalesce(extract(epoch FROM clock_timestamp() - min(available_at)
                            FILTER (WHERE available_at <= clock_timestamp())), 0)
      FROM {table}
     WHERE sent_at IS NULL
"""

# A scrape must not hang on a database that is struggling: past this the figures are left
# out of that scrape (milliseconds).
STATEMENT_TIMEOUT_MS = 2000


@dataclass(frozen=True)
class Backlog:
    table: str
    pending: int
    oldest_due_age_seconds: float


def outbox_backlog() -> list[Backlog]:
    """One ``Backlog`` per outbox table; raises ``DatabaseError`` when the database is away."""
    backlogs = []
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(f"SET LOCAL statement_timeout = {STATEMENT_TIMEOUT_MS}")
        for table in TABLES:
            cursor.execute(_BACKLOG.format(table=table))
            pending, age = cursor.fetchone()
            backlogs.append(Backlog(table, int(pending), max(float(age), 0.0)))
    return backlogs
