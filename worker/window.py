"""The run bookkeeping of a window of deliveries, in groups: one thread, one connection.

The task runtime keeps two durable records per message: the claim of its run before the
handler starts, the outcome before the ack. Paid one round trip each per message, they
bound a worker at a few hundred no-op tasks a second. Here they are paid per window:

- the deliveries the consume loop received together (the broker hands over more than
  there are slots) are claimed together, in one statement, as soon as they arrive; a slot
  that takes one finds its claim made (or waits for the statement in progress);
- a slot whose handler succeeded hands the outcome over and takes its next message; the
  outcomes that gathered meanwhile are committed in one statement (a group commit), then
  acked in one call to the broker (one ``multiple`` ack on RabbitMQ, ``DeleteMessageBatch``
  on SQS). The ack never precedes its commit: a crash in between delivers copies of
  runs already ``succeeded``, which are recognised as duplicates and only acked.

The same thread watches the handlers' time limits (``TaskProcessor.expired``).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import close_old_connections, connection

from broker.consume import Delivery
from outbox.runs import Lease, Started

if TYPE_CHECKING:
    from worker.processor import TaskProcessor

logger = logging.getLogger("hubdommed.worker")

# The longest the thread sleeps when nothing wakes it (time limits are checked as often).
MAX_SLEEP = 0.5
# With nothing to do for this long, the thread lets go of its database connection.
IDLE_CLOSE_SECONDS = 5.0


@dataclass(eq=False)
class Prepared:
    """A delivery's claim, made with the others of its window."""

    delivery: Delivery
    done: threading.Event = field(default_factory=threading.Event)
    envelope: dict[str, Any] | None = None
    lease: Lease | None = None
    started: Started | None = None
    # The message's own problem (unreadable), or the database's.
    error: BaseException | None = None
    # Given back by a shutdown while it was being claimed: not to be run.
    given_back: bool = False


@dataclass(eq=False)
class _Outcome:
    delivery: Delivery
    # The run to mark ``succeeded`` by its holder; None: a duplicate, only acked.
    lease: Lease | None
    outcome: str


class RunWindow:
    def __init__(self, processor: TaskProcessor) -> None:
        self.processor = processor
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._to_claim: list[Prepared] = []
        self._prepared: dict[int, Prepared] = {}
        self._to_settle: list[_Outcome] = []
        # Outcomes taken by the thread and not acked yet.
        self._settling = 0
        self._thread: threading.Thread | None = None
        self.claim_statements = 0
        self.commit_statements = 0

    # -- from the consume loop's thread and the slots -------------------------------------

    def prepare(self, deliveries: list[Delivery]) -> None:
        """Claim the runs of these deliveries, together, before any slot asks (no waiting
        here: the consume loop's thread calls it)."""
        with self._lock:
            for delivery in deliveries:
                if id(delivery) not in self._prepared:
                    prepared = Prepared(delivery)
                    self._prepared[id(delivery)] = prepared
                    self._to_claim.append(prepared)
            self._ensure_thread()
        self._wake.set()

    def claim(self, delivery: Delivery) -> Prepared:
        """The delivery's claim, waiting for its window's statement if need be."""
        with self._lock:
            prepared = self._prepared.get(id(delivery))
        if prepared is None:
            self.prepare([delivery])
            with self._lock:
                prepared = self._prepared[id(delivery)]
        prepared.done.wait()
        with self._lock:
            self._prepared.pop(id(delivery), None)
        return prepared

    def forget(self, delivery: Delivery) -> Prepared | None:
        """A delivery given back before a slot took it: its claim, if one was made."""
        with self._lock:
            prepared = self._prepared.get(id(delivery))
        if prepared is None or not prepared.done.is_set():
            return None
        with self._lock:
            self._prepared.pop(id(delivery), None)
        return prepared

    def settle(self, delivery: Delivery, lease: Lease | None, outcome: str) -> None:
        """Commit this outcome with the others that gathered meanwhile, then ack; no
        waiting here (the slot takes its next message)."""
        with self._lock:
            self._to_settle.append(_Outcome(delivery, lease, outcome))
            self._ensure_thread()
        self._wake.set()

    def unsettled(self) -> int:
        with self._lock:
            return len(self._to_settle) + self._settling

    def wake(self) -> None:
        self._wake.set()

    # -- the bookkeeping thread -----------------------------------------------------------

    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="runs", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        idle_since = time.monotonic()
        connected = False
        while True:
            self._wake.wait(min(MAX_SLEEP, self.processor.until_next_deadline()))
            self._wake.clear()
            with self._lock:
                outcomes, self._to_settle = self._to_settle, []
                claims, self._to_claim = self._to_claim, []
                self._settling += len(outcomes)
            if outcomes or claims:
                if not connected:
                    close_old_connections()
                    connected = True
                # Outcomes first: their acks free the broker's window for more messages.
                if outcomes:
                    try:
                        self._settle(outcomes)
                    finally:
                        with self._lock:
                            self._settling -= len(outcomes)
                if claims:
                    self._claim(claims)
                idle_since = time.monotonic()
            self.processor.abandon_expired()
            if connected and time.monotonic() - idle_since > IDLE_CLOSE_SECONDS:
                connection.close()
                connected = False

    def _claim(self, batch: list[Prepared]) -> None:
        try:
            self.claim_statements += 1
            self.processor.claim_window(batch)
        except Exception as exc:
            # The database is away: each slot gives its message back for later.
            logger.exception("claiming %d runs failed", len(batch))
            for prepared in batch:
                if prepared.error is None and prepared.started is None:
                    prepared.error = exc
            connection.close()
        finally:
            for prepared in batch:
                prepared.done.set()

    def _settle(self, outcomes: list[_Outcome]) -> None:
        mine = [item for item in outcomes if item.delivery.take_settlement()]
        # Not mine: given back by a shutdown meanwhile; its run was put back to queued.
        if not mine:
            return
        leases = [item.lease for item in mine if item.lease is not None]
        try:
            if leases:
                self.commit_statements += 1
                marked = self.processor.ledger.succeeded_many(leases)
                lost = {lease.run_id for lease in leases} - marked
                if lost:
                    # Taken over after the lease expired: the holder now records its own.
                    logger.warning("runs taken over before their success was recorded: %s", lost)
        except Exception:
            logger.exception("recording %d outcomes failed; they will come back", len(leases))
            connection.close()
            self.processor.come_back_later([item.delivery for item in mine], "infrastructure")
            return
        finally:
            for item in mine:
                self.processor.let_go(item.delivery)
        # Committed: now the acks, all in one call.
        unacked = {id(d) for d in self.processor.consumer.ack_many([i.delivery for i in mine])}
        for item in mine:
            failed = id(item.delivery) in unacked
            self.processor.settled(item.delivery, item.outcome, unsettled=failed)
