"""The statements the relay runs on the outbox tables: claim what is due, then record
what the broker answered, in one transaction.

``due_batch`` claims up to ``limit`` due rows of a table with ``FOR UPDATE SKIP LOCKED``
(SKIP LOCKED keeps two relays from sending the same row) and holds their locks while the
caller sends them; ``record`` then, in the same transaction:

- marks ``sent_at`` on what the broker confirmed;
- adds one to ``attempts`` of what the broker never answered (it is unreachable): the
  row is not at fault, so it stays due;
- adds one to ``attempts`` of what the broker refused one by one, and moves its
  ``available_at`` forward (exponential, capped by ``RELAY_RETRY_BACKOFF_MAX``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection, transaction

from broker.base import OutgoingMessage, SendResult
from outbox.models import OutboxMessage, PlatformOutboxMessage

TABLES = (OutboxMessage._meta.db_table, PlatformOutboxMessage._meta.db_table)

# The partial index on pending rows serves this (outbox_messages_pending_idx).
_CLAIM = """
    SELECT id, run_id::text, envelope::text, envelope->>'destination', envelope->>'task',
           coalesce(envelope->>'correlation_id', ''), envelope->>'event'
      FROM {table}
     WHERE sent_at IS NULL AND available_at <= clock_timestamp()
     ORDER BY id
     LIMIT %s
       FOR UPDATE SKIP LOCKED
"""
_MARK_SENT = "UPDATE {table} SET sent_at = clock_timestamp() WHERE id = ANY(%s)"
_COUNT_ATTEMPT = "UPDATE {table} SET attempts = attempts + 1 WHERE id = ANY(%s)"
_BACK_OFF = """
    UPDATE {table}
       SET attempts = attempts + 1,
           available_at = clock_timestamp()
                          + least(%s, %s * power(2, least(attempts, 30))) * interval '1 second'
     WHERE id = ANY(%s)
"""


@dataclass
class DueBatch:
    table: str
    messages: list[OutgoingMessage] = field(default_factory=list)
    _cursor: object = None

    def record(self, result: SendResult) -> None:
        """What the broker answered, written before the claim's transaction commits."""
        cursor, table = self._cursor, self.table
        if result.sent:
            cursor.execute(_MARK_SENT.format(table=table), [result.sent])
        if result.unconfirmed:
            cursor.execute(_COUNT_ATTEMPT.format(table=table), [result.unconfirmed])
        if result.rejected:
            cursor.execute(
                _BACK_OFF.format(table=table),
                [
                    settings.RELAY_RETRY_BACKOFF_MAX,
                    settings.RELAY_RETRY_BACKOFF,
                    list(result.rejected),
                ],
            )


@contextmanager
def due_batch(table: str, limit: int) -> Iterator[DueBatch]:
    """Up to ``limit`` due rows of ``table``, locked until the block ends (and commits)."""
    if table not in TABLES:
        raise ValueError(f"not an outbox table: {table!r}")
    with transaction.atomic(), connection.cursor() as cursor:
        # Losing this commit in a database crash only means sending these rows again,
        # which consumers tolerate; not waiting for its disk flush makes each batch cheaper.
        cursor.execute("SET LOCAL synchronous_commit TO OFF")
        cursor.execute(_CLAIM.format(table=table), [limit])
        batch = DueBatch(
            table,
            [
                OutgoingMessage(
                    key=row_id,
                    run_id=run_id,
                    destination=destination,
                    task=task,
                    body=body.encode(),
                    correlation_id=correlation_id,
                    event=event,
                )
                for row_id, run_id, body, destination, task, correlation_id, event in (
                    cursor.fetchall()
                )
            ],
            cursor,
        )
        yield batch
