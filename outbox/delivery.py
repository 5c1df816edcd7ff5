"""The statements the relay runs on the outbox tables: claim what is due, then record
what the broker answered, in one transaction.

``due_batch`` claims up to ``limit`` due rows of a table with ``FOR UPDATE SKIP LOCKED``
(SKIP LOCKED keeps two relays from sending the same row) and holds their locks while the
caller sends them; ``record`` then, in the same transaction:

- marks ``sent_at`` on what the broker confirmed;
- adds one to ``attempts`` of what the broker never answered (it is unreachable): the
  row is not at fault, so it stays due;
- adds one to ``attempts`` of what the broker refused one by one, and moves its
  ``available_at`` forward (exponential, capped by ``RELAY_RETRY_BACKOFF_MAX``); the
  broker's reason goes to the run's ``last_error``, where an operator (and the monitor's
  report of a row refused again and again) finds it.

``open_batch`` does the same on a connection of the caller's (``ClaimConnection``), with
the transaction left open until ``DueBatch.commit``: the relay keeps two batches in flight
that way, each holding its own rows' locks in its own transaction, so a batch is claimed
and published while the broker confirms the previous one.

The claim's plan does not depend on statistics. On a table never analysed (a new
environment, a restored dump, autovacuum behind a burst) the planner guesses that few rows
are pending and prefers a bitmap scan of every pending row followed by a sort, under the
row locks: 200 times slower than walking the partial index on pending rows in id order,
which stops after ``limit`` rows. The claim's transaction switches off the plans that read
every pending row (``CLAIM_PLANNER``), so the index walk is the only plan left.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connection, connections, transaction
from django.db.backends.base.base import BaseDatabaseWrapper

from broker.base import OutgoingMessage, SendResult
from common.jsondata import storable_text
from outbox.models import OutboxMessage, PlatformOutboxMessage

TABLES = (OutboxMessage._meta.db_table, PlatformOutboxMessage._meta.db_table)

# Per claim transaction, in one round trip: no disk flush wait at commit (losing the commit
# in a database crash only means sending these rows again, which consumers tolerate), and
# no plan but the walk of the pending index (see above); SET LOCAL: the transaction only.
CLAIM_PLANNER = """
    SELECT set_config('synchronous_commit', 'off', true),
           set_config('enable_bitmapscan', 'off', true),
           set_config('enable_seqscan', 'off', true),
           set_config('enable_sort', 'off', true)
"""
# The partial index on pending rows serves this (outbox_messages_pending_idx) in id order.
CLAIM = """
    SELECT id, run_id::text, envelope::text, envelope->>'destination', envelope->>'task',
           coalesce(envelope->>'correlation_id', ''), envelope->>'event', {tenant},
           envelope->>'traceparent', extract(epoch FROM clock_timestamp() - available_at)::float8
      FROM {table}
     WHERE sent_at IS NULL AND available_at <= clock_timestamp()
     ORDER BY id
     LIMIT %s
       FOR UPDATE SKIP LOCKED
"""
TENANT_COLUMN = {
    OutboxMessage._meta.db_table: "tenant_id::text",
    PlatformOutboxMessage._meta.db_table: "NULL",
}
_MARK_SENT = "UPDATE {table} SET sent_at = clock_timestamp() WHERE id = ANY(%s)"
_COUNT_ATTEMPT = "UPDATE {table} SET attempts = attempts + 1 WHERE id = ANY(%s)"
_BACK_OFF = """
    UPDATE {table}
       SET attempts = attempts + 1,
           available_at = clock_timestamp()
                          + least(%s, %s * power(2, least(attempts, 30))) * interval '1 second'
     WHERE id = ANY(%s)
"""

# Why the broker refused a run's message, for an operator. SKIP LOCKED: a run a worker
# holds right now is not waited for (the note is only information, the batch's locks must
# not wait on a worker's, which may wait on this batch's rows). The runs are found by key
# and their status checked once locked, as the worker's statements do (``outbox.runs``):
# a status condition on ``task_runs`` itself may walk every unfinished run.
_NOTE_REFUSAL = """
    WITH locked AS MATERIALIZED (
        SELECT run_id, status FROM task_runs
         WHERE run_id = ANY(%(run_ids)s::uuid[])
         ORDER BY run_id FOR UPDATE SKIP LOCKED)
    UPDATE task_runs AS run SET last_error = 'Refused by the broker: ' || refused.why
      FROM unnest(%(run_ids)s::uuid[], %(whys)s::text[]) AS refused(run_id, why)
     WHERE run.run_id = refused.run_id
       AND run.run_id IN (SELECT run_id FROM locked WHERE status IN ('queued', 'retrying'))
"""


@dataclass
class DueBatch:
    table: str
    messages: list[OutgoingMessage] = field(default_factory=list)
    _cursor: object = None
    _db: BaseDatabaseWrapper | None = None

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
            run_ids = {message.key: message.run_id for message in self.messages}
            # The broker's words (or a library's): storable, or the whole record fails and
            # every row of the batch, the sent ones too, is sent again.
            refused = [(run_ids[key], storable_text(why)) for key, why in result.rejected.items()]
            cursor.execute(
                _NOTE_REFUSAL,
                {
                    "run_ids": [run_id for run_id, _ in refused],
                    "whys": [why for _, why in refused],
                },
            )

    def commit(self, result: SendResult) -> None:
        """``record``, then commit: the end of a batch from ``open_batch``."""
        self.record(result)
        self._end(commit=True)

    def rollback(self) -> None:
        """Give the rows back untouched (they stay due)."""
        self._end(commit=False)

    def _end(self, *, commit: bool) -> None:
        db = self._db
        if db is None:
            raise RuntimeError("a batch from due_batch ends with its block")
        self._db = None
        try:
            self._cursor.close()
            if commit:
                db.commit()
            else:
                db.rollback()
        finally:
            db.set_autocommit(True)


class ClaimConnection:
    """A database connection of the relay's own, for one open batch at a time.

    Not the thread's ``connection``: two of these hold two batches' transactions at once.
    A connection that failed is closed and opened again by its next claim.
    """

    def __init__(self) -> None:
        self.db = connections.create_connection(DEFAULT_DB_ALIAS)

    def check(self) -> None:
        """Drop the connection if it went bad while idle (a restart, a terminated
        backend), so that the next claim opens a new one instead of failing."""
        db = self.db
        if db.connection is not None and (db.errors_occurred or not db.is_usable()):
            self.close()

    def close(self) -> None:
        try:
            self.db.close()
        except Exception:  # already broken: nothing left to save
            self.db.connection = None


def _messages(rows) -> list[OutgoingMessage]:
    return [
        OutgoingMessage(
            key=row_id,
            run_id=run_id,
            destination=destination,
            task=task,
            body=body.encode(),
            correlation_id=correlation_id,
            event=event,
            tenant_id=tenant_id,
            traceparent=traceparent,
            waited=waited,
        )
        for (
            row_id,
            run_id,
            body,
            destination,
            task,
            correlation_id,
            event,
            tenant_id,
            traceparent,
            waited,
        ) in rows
    ]


def _claim(cursor, table: str, limit: int) -> list[OutgoingMessage]:
    if table not in TABLES:
        raise ValueError(f"not an outbox table: {table!r}")
    cursor.execute(CLAIM_PLANNER)
    cursor.execute(CLAIM.format(table=table, tenant=TENANT_COLUMN[table]), [limit])
    return _messages(cursor.fetchall())


@contextmanager
def due_batch(table: str, limit: int) -> Iterator[DueBatch]:
    """Up to ``limit`` due rows of ``table``, locked until the block ends (and commits)."""
    if table not in TABLES:
        raise ValueError(f"not an outbox table: {table!r}")
    with transaction.atomic(), connection.cursor() as cursor:
        yield DueBatch(table, _claim(cursor, table, limit), cursor)


def open_batch(claimer: ClaimConnection, table: str, limit: int) -> DueBatch:
    """Up to ``limit`` due rows of ``table``, locked in a transaction of ``claimer``'s that
    stays open until ``commit`` (or ``rollback``) of the batch returned."""
    if table not in TABLES:
        raise ValueError(f"not an outbox table: {table!r}")
    db = claimer.db
    db.ensure_connection()
    db.set_autocommit(False)
    cursor = db.cursor()
    try:
        messages = _claim(cursor, table, limit)
    except BaseException:
        cursor.close()
        try:
            db.rollback()
            db.set_autocommit(True)
        except Exception:  # gone: the next claim opens a new one
            claimer.close()
        raise
    return DueBatch(table, messages, cursor, db)
