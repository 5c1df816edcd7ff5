"""One pass of the relay over the outbox tables: claim, send, mark, in one transaction.

A pass claims up to ``batch_size`` due rows of a table with ``FOR UPDATE SKIP LOCKED``
(SKIP LOCKED keeps two relays from sending the same row), hands them to the transport
while holding the locks, and in the same transaction:

- marks ``sent_at`` on what the broker confirmed;
- adds one to ``attempts`` of what the broker never answered (it is unreachable): the
  row is not at fault, so it stays due and the relay itself waits before retrying;
- adds one to ``attempts`` of what the broker refused one by one (a nack, a return, the
  channel closed over that message), and moves its ``available_at`` forward
  (exponential, capped), so a poison row neither blocks the others nor makes the relay
  loop hot on it. A refusal of one message is never an outage.

Delivery is at least once: a crash between the broker's confirm and the commit sends
those rows again, and consumers dedupe by ``run_id``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from outbox.models import OutboxMessage, PlatformOutboxMessage
from relay.transports import OutgoingMessage, SendResult, Transport, get_transport

logger = logging.getLogger("hubdommed.relay")

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

# Waiting between reconnection attempts while the broker (or the database) is unreachable.
# Capped low: a failed attempt costs little (a refused connection), and the time from a
# dependency's return to the backlog draining must not grow with the outage's length.
OUTAGE_BACKOFF_FIRST = 0.5
OUTAGE_BACKOFF_MAX = 2.0


@dataclass(frozen=True)
class BatchReport:
    table: str
    claimed: int
    sent: int = 0
    rejected: int = 0
    unconfirmed: int = 0
    error: str | None = None
    seconds: float = 0.0

    def line(self) -> str:
        text = (
            f"relay batch table={self.table} claimed={self.claimed} sent={self.sent} "
            f"rejected={self.rejected} unconfirmed={self.unconfirmed} "
            f"ms={self.seconds * 1000:.1f}"
        )
        return f"{text} error={self.error!r}" if self.error else text


class OutboxRelay:
    def __init__(self, transport: Transport | None = None, batch_size: int | None = None):
        self._transport = transport
        self.batch_size = batch_size or settings.RELAY_BATCH_SIZE
        self.sent = 0
        self.batches = 0
        # Consecutive passes that found the broker unreachable (0: it answers).
        self.outages = 0

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = get_transport()
        return self._transport

    @property
    def outage_backoff(self) -> float:
        """Seconds to wait before trying the broker again (0 when it answers)."""
        if not self.outages:
            return 0.0
        return min(OUTAGE_BACKOFF_MAX, OUTAGE_BACKOFF_FIRST * 2 ** (self.outages - 1))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def relay_one_batch(self) -> bool:
        """One pass over each outbox table. True when a table gave a full batch (more may
        be due right away)."""
        more = False
        for table in TABLES:
            report = self.relay_table(table)
            if report.claimed:
                self.batches += 1
                self.sent += report.sent
                level = logging.WARNING if report.error or report.rejected else logging.INFO
                logger.log(level, report.line())
            if report.error:
                self._note_outage(report.error)
                # No use asking an unreachable broker about the other table.
                return False
            if report.claimed >= self.batch_size:
                more = True
        if self.outages:
            logger.info("broker reachable again after %d failed passes", self.outages)
            self.outages = 0
        return more

    def _note_outage(self, error: str) -> None:
        self.outages += 1
        logger.warning(
            "broker unreachable (%s); rows stay pending, retrying in %.1f s",
            error,
            self.outage_backoff,
        )

    def relay_table(self, table: str) -> BatchReport:
        started = time.perf_counter()
        with transaction.atomic(), connection.cursor() as cursor:
            # Losing this commit in a database crash only means sending these rows again,
            # which consumers tolerate; not waiting for its disk flush makes each batch cheaper.
            cursor.execute("SET LOCAL synchronous_commit TO OFF")
            cursor.execute(_CLAIM.format(table=table), [self.batch_size])
            rows = cursor.fetchall()
            if not rows:
                return BatchReport(table=table, claimed=0)
            messages = [
                OutgoingMessage(
                    key=row_id,
                    run_id=run_id,
                    destination=destination,
                    task=task,
                    body=body.encode(),
                    correlation_id=correlation_id,
                    event=event,
                )
                for row_id, run_id, body, destination, task, correlation_id, event in rows
            ]
            result = self.transport.send(messages)
            self._record(cursor, table, result)
        if result.rejected:
            logger.warning(
                "relay: %d rows refused by the broker, backing off; first: %s",
                len(result.rejected),
                "; ".join(f"id={key}: {why}" for key, why in list(result.rejected.items())[:3]),
            )
        return BatchReport(
            table=table,
            claimed=len(rows),
            sent=len(result.sent),
            rejected=len(result.rejected),
            unconfirmed=len(result.unconfirmed),
            error=result.error,
            seconds=time.perf_counter() - started,
        )

    def _record(self, cursor, table: str, result: SendResult) -> None:
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
