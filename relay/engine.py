"""The relay's passes over the outbox tables: claim, send, mark, one transaction per batch.

A batch claims up to ``batch_size`` due rows of a table (``outbox.delivery``, which owns
the statements), hands them to the transport while holding the locks, and in the same
transaction records the answer:

- marks ``sent_at`` on what the broker confirmed;
- adds one to ``attempts`` of what the broker never answered (it is unreachable): the
  row is not at fault, so it stays due and the relay itself waits before retrying;
- adds one to ``attempts`` of what the broker refused one by one (a nack, a return, the
  channel closed over that message), and moves its ``available_at`` forward
  (exponential, capped), so a poison row neither blocks the others nor makes the relay
  loop hot on it. A refusal of one message is never an outage.

``relay_one_batch`` runs one batch per table and waits for each. ``drain`` (the daemon's)
keeps up to ``transport.max_in_flight`` batches in flight: while the broker confirms one,
the next is published on a channel of its own, and the one after it is claimed already
(``SKIP LOCKED`` passes over the rows of the others, still locked by their open
transactions). Each batch keeps its own transaction on its own database connection, so
every guarantee above holds per batch: a crash or a lost connection with batches in flight
leaves the rows of all of them due (sent again later: duplicates, never losses), and
nothing is marked sent without its confirm.

Delivery is at least once: a crash between the broker's confirm and the commit sends
those rows again, and consumers dedupe by ``run_id``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.conf import settings

from broker import OutgoingMessage, SendResult, Transport, get_transport
from broker.base import PendingSend
from common import tracing
from common.context import log_context
from common.metrics import Heartbeat
from lifecycle import Backoff
from outbox.delivery import TABLES, ClaimConnection, DueBatch, due_batch, open_batch
from relay import metrics

logger = logging.getLogger("hubdommed.relay")

# Run ids named in a batch's log line; a bigger batch names these and counts the rest.
RUN_IDS_LOGGED = 20

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

    def fields(self) -> dict[str, object]:
        """The batch's figures, for its log line's ``extra``."""
        return {
            "table": self.table,
            "claimed": self.claimed,
            "sent": self.sent,
            "refused": self.rejected,
            "unconfirmed": self.unconfirmed,
            "duration_ms": round(self.seconds * 1000, 1),
            "error": self.error,
        }


@dataclass
class _Flight:
    """A batch whose rows are locked and written to the broker, confirms on their way."""

    batch: DueBatch
    pending: PendingSend
    claimer: ClaimConnection
    started: float


class OutboxRelay:
    def __init__(self, transport: Transport | None = None, batch_size: int | None = None):
        self._transport = transport
        self.batch_size = batch_size or settings.RELAY_BATCH_SIZE
        self.sent = 0
        self.batches = 0
        # Consecutive passes that found the broker unreachable, and the pause they call for.
        self._outage = Backoff(OUTAGE_BACKOFF_FIRST, OUTAGE_BACKOFF_MAX)
        # ``drain``'s database connections, one per batch in flight (opened when needed).
        self._claimers: list[ClaimConnection] = []
        # The thread those connections live on (Django's connections belong to a thread).
        self._db_thread: ThreadPoolExecutor | None = None
        self.heartbeat = Heartbeat("relay", settings.LIVENESS_FILE)

    @property
    def transport(self) -> Transport:
        if self._transport is None:
            self._transport = get_transport()
            # Held by the broker's flow control, the relay is waiting, not hung.
            self._transport.on_held = self.heartbeat.beat
        return self._transport

    @property
    def outages(self) -> int:
        """Consecutive passes that found the broker unreachable (0: it answers)."""
        return self._outage.failures

    @property
    def outage_backoff(self) -> float:
        """Seconds to wait before trying the broker again (0 when it answers)."""
        return self._outage.pause

    def close(self) -> None:
        if self._db_thread is not None:
            for claimer in self._claimers:
                self._db_thread.submit(claimer.close).result()
            self._db_thread.shutdown()
            self._db_thread = None
        self._claimers = []
        if self._transport is not None:
            self._transport.close()

    # -- one batch per table, waiting for each -----------------------------------------------

    def relay_one_batch(self) -> bool:
        """One pass over each outbox table. True when a table gave a full batch (more may
        be due right away)."""
        more = False
        for table in TABLES:
            report = self.relay_table(table)
            if report.error:
                self._note_outage(report.error)
                # No use asking an unreachable broker about the other table.
                return False
            if report.claimed >= self.batch_size:
                more = True
        self._broker_answered()
        return more

    def relay_table(self, table: str) -> BatchReport:
        started = time.perf_counter()
        with due_batch(table, self.batch_size) as batch:
            if not batch.messages:
                return BatchReport(table=table, claimed=0)
            result = self.transport.send(batch.messages)
            batch.record(result)
        return self._account(table, batch.messages, result, started)

    # -- batches in flight, until nothing is due -----------------------------------------------

    def drain(self, stop: Callable[[], bool] = lambda: False) -> None:
        """Batches until nothing is due, the broker is unreachable, or ``stop()`` says so,
        with up to ``transport.max_in_flight`` of them in flight; the tables take turns.

        The database work runs on a thread of its own (``_database``), one statement after
        the other in the order given: the next batch is claimed, and the last one's answer
        committed, while this thread writes to the broker and waits for its confirms.
        """
        window = self.transport.max_in_flight
        if window < 2:
            while not stop() and self.relay_one_batch():
                pass
            return
        db = self._database()
        # One connection per batch in flight, and one for the batch claimed ahead.
        while len(self._claimers) < window + 1:
            self._claimers.append(db.submit(ClaimConnection).result())
        for claimer in self._claimers:
            db.submit(claimer.check).result()
        free = list(self._claimers)
        in_flight: deque[_Flight] = deque()
        committing: deque[tuple[Future, _Flight, SendResult]] = deque()
        ahead: tuple[Future, ClaimConnection, float] | None = None
        active = list(TABLES)  # the tables that may have more due
        turn = 0
        outage: str | None = None
        try:
            while True:
                claiming = outage is None and not stop()
                if ahead is None and claiming and active and free:
                    table = active[turn % len(active)]
                    turn += 1
                    claimer = free.pop()
                    future = db.submit(open_batch, claimer, table, self.batch_size)
                    ahead = (future, claimer, time.perf_counter())
                if ahead is not None and len(in_flight) < window:
                    future, claimer, started = ahead
                    ahead = None
                    batch = future.result()
                    if len(batch.messages) < self.batch_size and batch.table in active:
                        active.remove(batch.table)
                    if not batch.messages or not claiming:
                        db.submit(batch.rollback)
                        free.append(claimer)
                        continue
                    pending = self.transport.begin(batch.messages)
                    in_flight.append(_Flight(batch, pending, claimer, started))
                    continue
                if not in_flight:
                    break
                flight = in_flight.popleft()
                result = flight.pending.result()
                committing.append((db.submit(flight.batch.commit, result), flight, result))
                # Its next claim runs after this commit (one statement after the other).
                free.append(flight.claimer)
                if result.error and outage is None:
                    outage = result.error
                self._settle(committing, wait=False)
            self._settle(committing, wait=True)
        except BaseException:
            # A database error (or a bug): the open transactions roll back with their
            # connections, so their rows stay due; the confirms still on their way are
            # dropped with the broker connection (those rows are sent again later).
            for claimer in self._claimers:
                db.submit(claimer.close).result()
            if in_flight or ahead is not None:
                self.transport.close()
            raise
        if outage is not None:
            self._note_outage(outage)
        else:
            self._broker_answered()

    def _settle(self, committing: deque, *, wait: bool) -> None:
        """Account the batches whose commit is done (all of them with ``wait``); a commit
        that failed raises here."""
        while committing and (wait or committing[0][0].done()):
            future, flight, result = committing.popleft()
            future.result()
            self._account(flight.batch.table, flight.batch.messages, result, flight.started)

    def _database(self) -> ThreadPoolExecutor:
        if self._db_thread is None:
            self._db_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="relay-db")
        return self._db_thread

    # -- accounting ------------------------------------------------------------------------------

    def _account(
        self,
        table: str,
        messages: Sequence[OutgoingMessage],
        result: SendResult,
        started: float,
    ) -> BatchReport:
        report = BatchReport(
            table=table,
            claimed=len(messages),
            sent=len(result.sent),
            rejected=len(result.rejected),
            unconfirmed=len(result.unconfirmed),
            error=result.error,
            seconds=time.perf_counter() - started,
        )
        self.batches += 1
        self.sent += report.sent
        metrics.BATCHES.labels(table=table).inc()
        metrics.BATCH_DURATION.labels(table=table).observe(report.seconds)
        if report.sent:
            metrics.MESSAGES_SENT.labels(table=table).inc(report.sent)
        if report.rejected:
            metrics.MESSAGES_REFUSED.labels(table=table).inc(report.rejected)
            logger.warning(
                "relay: %d rows refused by the broker, backing off; first: %s",
                report.rejected,
                "; ".join(f"id={key}: {why}" for key, why in list(result.rejected.items())[:3]),
            )
        if report.unconfirmed:
            metrics.MESSAGES_UNCONFIRMED.labels(table=table).inc(report.unconfirmed)
        level = logging.WARNING if report.error or report.rejected else logging.INFO
        fields = report.fields()
        if messages:
            # What the batch moved, at the default level: its runs (the first ones, and how
            # many in all) and how long the longest-waiting row had been due.
            fields["runs"] = len(messages)
            fields["run_ids"] = [message.run_id for message in messages[:RUN_IDS_LOGGED]]
            fields["oldest_waited_s"] = round(max(message.waited for message in messages), 3)
        if messages and tracing.active():
            traces = self._trace(table, messages, result, started)
            if traces:
                fields["trace_ids"] = traces
        logger.log(level, "relayed batch", extra=fields)
        if result.sent and logger.isEnabledFor(logging.DEBUG):
            by_key = {message.key: message for message in messages}
            for key in result.sent:
                message = by_key[key]
                with log_context(
                    correlation_id=message.correlation_id or None,
                    run_id=message.run_id,
                    tenant_id=message.tenant_id,
                ):
                    logger.debug(
                        "relayed message",
                        extra={
                            "table": table,
                            "task": message.task,
                            "event": message.event,
                            # The trace of the request that dispatched it, while tracing is on.
                            "trace_id": tracing.trace_id_of(message.traceparent),
                        },
                    )
        self.heartbeat.beat()
        return report

    def _trace(
        self,
        table: str,
        messages: Sequence[OutgoingMessage],
        result: SendResult,
        started: float,
    ) -> list[str]:
        """One span per traced message of the batch, each in its own trace (the request's
        that dispatched it), over the batch's time from claim to the broker's answer.
        Returns the trace ids, for the batch's log line."""
        ended_ns = time.time_ns()
        started_ns = ended_ns - int((time.perf_counter() - started) * 1e9)
        refused, unconfirmed = result.rejected, set(result.unconfirmed)
        traces: list[str] = []
        for message in messages:
            if not message.traceparent:
                continue
            outcome = (
                "refused"
                if message.key in refused
                else "unconfirmed"
                if message.key in unconfirmed
                else "sent"
            )
            tracing.record_span(
                f"relay.publish {message.task}",
                traceparent=message.traceparent,
                started_ns=started_ns,
                ended_ns=ended_ns,
                kind=tracing.SpanKind.PRODUCER,
                attributes={
                    "messaging.system": settings.BROKER,
                    "messaging.operation.type": "publish",
                    "messaging.destination.name": message.destination,
                    "hubdommed.run_id": message.run_id,
                    "hubdommed.outbox_table": table,
                    "hubdommed.outcome": outcome,
                },
            )
            if trace_id := tracing.trace_id_of(message.traceparent):
                traces.append(trace_id)
        return sorted(set(traces))

    def _broker_answered(self) -> None:
        if self.outages:
            logger.info("broker reachable again after %d failed passes", self.outages)
            self._outage.reset()

    def _note_outage(self, error: str) -> None:
        self._outage.failed()
        logger.warning(
            "broker unreachable (%s); rows stay pending, retrying in %.1f s",
            error,
            self.outage_backoff,
        )
