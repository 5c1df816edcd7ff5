"""The run bookkeeping of a window of deliveries, in groups: one thread, one connection.

The task runtime keeps two durable records per message: the claim of its run before the
handler starts, the outcome before the ack. Paid one round trip each per message, they
bound a worker at a few hundred no-op tasks a second. Here they are paid per window:

- the deliveries the consume loop received together (the broker hands over more than
  there are slots) are claimed together, in one statement, as soon as they arrive; each
  one whose run is claimed is then handed to the slots (``ConsumeLoop.hand_over``), so a
  slot never waits for a claim, and one that needs no slot (a duplicate, a copy of a run
  held elsewhere) is settled right there;
- a slot whose handler succeeded hands the outcome over and takes its next message; the
  outcomes that gathered meanwhile are committed in one statement (a group commit), then
  acked in one call to the broker (one ``multiple`` ack on RabbitMQ, ``DeleteMessageBatch``
  on SQS). The ack never precedes its commit: a crash in between delivers copies of
  runs already ``succeeded``, which are recognised as duplicates and only acked.

Claims and outcomes have a thread each (each with its database connection), so that a
window's claim and the previous window's commit overlap; both end when the worker stops
(``close``). The claiming thread also watches the handlers' time limits
(``TaskProcessor.abandon_expired``) and claims again, once, the copies it put aside for a
moment (``park``: a run another worker claimed ahead, whose short lease ends within
seconds if that worker is dead).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import InterfaceError, OperationalError, close_old_connections, connection

from broker.consume import Consumer, Delivery
from lifecycle.failures import aborted_by, log_failure
from outbox.runs import Begin, Lease, RunLedger, Started
from worker.outcomes import Outcome

logger = logging.getLogger("hubdommed.worker")

# The longest the thread sleeps when nothing wakes it (time limits are checked as often).
MAX_SLEEP = 0.5
# With nothing to do for this long, the thread lets go of its database connection.
IDLE_CLOSE_SECONDS = 5.0
# After a pause this long, the connection is checked before it is used (the database may
# have restarted meanwhile); a busy thread does not pay for the check.
CHECK_AFTER_SECONDS = 1.0
# A group commit that fails (the database is away) is tried again, its leases still
# held, this many times, the pauses doubling from the first; then its messages are given
# back for later.
COMMIT_ATTEMPTS = 6
COMMIT_RETRY_FIRST = 0.25


@dataclass(eq=False)
class Prepared:
    """A delivery's claim, made with the others of its window."""

    delivery: Delivery
    envelope: dict[str, Any] | None = None
    lease: Lease | None = None
    started: Started | None = None
    # The message's own problem (unreadable), or the database's.
    error: BaseException | None = None
    # Given back by a shutdown while it was being claimed: not to be run.
    given_back: bool = False
    # Put aside once already (``RunWindow.park``): the next claim is its last.
    parked: bool = False
    # Put aside right now, waiting for that next claim.
    waiting: bool = False


@dataclass(eq=False)
class _Outcome:
    delivery: Delivery
    # The run to mark ``succeeded`` by its holder; None: a duplicate, only acked.
    lease: Lease | None
    outcome: Outcome


class Bookkeeper(Protocol):
    """What the window asks of the task processor (``worker.processor.TaskProcessor``)."""

    ledger: RunLedger
    consumer: Consumer

    def claim_window(self, batch: list[Prepared]) -> list[Prepared]:
        """Claim these runs; returns those to hand to a slot."""

    def until_next_deadline(self) -> float: ...

    def abandon_expired(self) -> None: ...

    def come_back_later(self, settled: list[tuple[Delivery, Outcome]]) -> None: ...

    def let_go_many(self, deliveries: list[Delivery]) -> None: ...

    def settled(self, delivery: Delivery, outcome: Outcome, *, unsettled: bool = False) -> None: ...


class RunWindow:
    def __init__(self, processor: Bookkeeper) -> None:
        self.processor = processor
        # Where a delivery whose run is claimed goes: the consume loop's slots (set when
        # the worker is built; until then, nowhere).
        self.hand_over: Callable[[Delivery], None] = _nowhere
        self._lock = threading.Lock()
        self._claims_waiting = threading.Event()
        self._outcomes_waiting = threading.Event()
        self._to_claim: list[Prepared] = []
        self._prepared: dict[int, Prepared] = {}
        # Copies put aside, by when to claim them again (a heap).
        self._parked: list[tuple[float, int, Prepared]] = []
        self._parked_order = itertools.count()
        self._to_settle: list[_Outcome] = []
        # Outcomes taken by the thread and not acked yet.
        self._in_settlement = 0
        self._claimer: threading.Thread | None = None
        self._settler: threading.Thread | None = None
        # The worker stopped: the threads end, and none starts again.
        self._closed = False
        self.claim_statements = 0
        self.commit_statements = 0
        # When each thread's bookkeeping under way began (None: not in one): ``stalled``.
        self._claiming_since: float | None = None
        self._settling_since: float | None = None

    # -- from the consume loop's thread and the slots -------------------------------------

    def prepare(self, deliveries: list[Delivery]) -> None:
        """Claim the runs of these deliveries, together; each is handed to a slot once its
        run is claimed (no waiting here: the consume loop's thread calls it)."""
        with self._lock:
            for delivery in deliveries:
                if id(delivery) not in self._prepared:
                    prepared = Prepared(delivery)
                    self._prepared[id(delivery)] = prepared
                    self._to_claim.append(prepared)
            self._ensure_threads()
        self._claims_waiting.set()

    def take(self, delivery: Delivery) -> Prepared | None:
        """The claim of a delivery handed to a slot (None: it was never prepared here)."""
        with self._lock:
            return self._prepared.pop(id(delivery), None)

    def forget(self, delivery: Delivery) -> Prepared | None:
        """A delivery given back before a slot took it: its claim, if one was made."""
        with self._lock:
            return self._prepared.pop(id(delivery), None)

    def park(self, prepared: Prepared, until: float) -> None:
        """Claim this one again at ``until`` (monotonic), once, without holding a slot."""
        prepared.parked = prepared.waiting = True
        with self._lock:
            heapq.heappush(self._parked, (until, next(self._parked_order), prepared))
        # Not woken now: the claiming thread looks at the heap before each sleep.

    def settle(self, delivery: Delivery, lease: Lease | None, outcome: Outcome) -> None:
        """Commit this outcome with the others that gathered meanwhile, then ack; no
        waiting here (the slot takes its next message)."""
        with self._lock:
            self._to_settle.append(_Outcome(delivery, lease, outcome))
            self._ensure_threads()
        if not self._outcomes_waiting.is_set():
            self._outcomes_waiting.set()

    def unsettled(self) -> int:
        with self._lock:
            return len(self._to_settle) + self._in_settlement

    @property
    def prepared(self) -> int:
        """Deliveries received and neither taken by a slot nor settled yet."""
        with self._lock:
            return len(self._prepared)

    def stalled(self) -> float:
        """Seconds the bookkeeping longest under way has been (0: none is): a claim or a
        group commit that does not end is a database that stopped answering mid-statement,
        which nothing else in the worker would notice (its consume loop goes on)."""
        now = time.monotonic()
        return max(
            (now - since for since in (self._claiming_since, self._settling_since) if since),
            default=0.0,
        )

    def wake(self) -> None:
        """A time limit sooner than the claiming thread's next look."""
        self._claims_waiting.set()

    def close(self) -> None:
        """The worker stopped (what it did not finish was given back): both threads end at
        once, each after the statement it may be in, and none starts again. A handler that
        returns later has nothing left to settle: its delivery was given back."""
        with self._lock:
            self._closed = True
        self._claims_waiting.set()
        self._outcomes_waiting.set()

    # -- the bookkeeping thread -----------------------------------------------------------

    def _ensure_threads(self) -> None:
        if self._closed:
            return
        if self._claimer is None or not self._claimer.is_alive():
            self._claimer = threading.Thread(target=self._claiming, name="runs-claim", daemon=True)
            self._claimer.start()
        if self._settler is None or not self._settler.is_alive():
            self._settler = threading.Thread(target=self._settling, name="runs-done", daemon=True)
            self._settler.start()

    def _claiming(self) -> None:
        with _Connection() as db:
            while True:
                with self._lock:
                    parked_at = self._parked[0][0] if self._parked else float("inf")
                sleep = min(
                    MAX_SLEEP,
                    self.processor.until_next_deadline(),
                    max(0.0, parked_at - time.monotonic()),
                )
                self._claims_waiting.wait(sleep)
                self._claims_waiting.clear()
                now = time.monotonic()
                with self._lock:
                    if self._closed:
                        return
                    claims, self._to_claim = self._to_claim, []
                    while self._parked and self._parked[0][0] <= now:
                        prepared = heapq.heappop(self._parked)[2]
                        prepared.waiting = False
                        if prepared.delivery.settled:
                            # Given back by a shutdown meanwhile.
                            self._prepared.pop(id(prepared.delivery), None)
                        else:
                            claims.append(prepared)
                if claims:
                    self._claiming_since = time.monotonic()
                    try:
                        db.use()
                        self._claim(claims)
                    finally:
                        self._claiming_since = None
                self.processor.abandon_expired()
                db.idle()

    def _settling(self) -> None:
        with _Connection() as db:
            while True:
                self._outcomes_waiting.wait(MAX_SLEEP)
                self._outcomes_waiting.clear()
                with self._lock:
                    if self._closed:
                        return
                    outcomes, self._to_settle = self._to_settle, []
                    self._in_settlement += len(outcomes)
                if outcomes:
                    self._settling_since = time.monotonic()
                    try:
                        db.use()
                        self._settle(outcomes)
                    finally:
                        self._settling_since = None
                        with self._lock:
                            self._in_settlement -= len(outcomes)
                db.idle()

    def _claim(self, batch: list[Prepared]) -> None:
        ready: list[Prepared] = []
        try:
            self.claim_statements += 1
            try:
                ready = self.processor.claim_window(batch)
            except (InterfaceError, OperationalError) as exc:
                if aborted_by(exc) is not None:
                    raise  # another transaction's doing, not the connection's
                # A connection the database dropped: once more on a new one (a claim whose
                # answer was lost is found held by its own holder).
                connection.close()
                ready = self.processor.claim_window(batch)
        except Exception as exc:
            # The database is away: each slot gives its message back for later.
            log_failure(logger, exc, "claiming %d runs failed", len(batch))
            ready = []
            for prepared in batch:
                if prepared.delivery.settled or prepared.given_back:
                    continue
                if prepared.started is None:
                    # Not claimed: its slot gives it back for later.
                    prepared.error = prepared.error or exc
                    ready.append(prepared)
                elif prepared.started.decision is Begin.RUN:
                    # Claimed and held before the failure: it runs.
                    ready.append(prepared)
            connection.close()
        handed = {id(prepared) for prepared in ready}
        with self._lock:
            for prepared in batch:
                if id(prepared) not in handed and not prepared.waiting:
                    # Settled here, without a slot (a duplicate, a copy of a run held
                    # elsewhere, a fresh copy's place taken), or given back meanwhile.
                    self._prepared.pop(id(prepared.delivery), None)
        for prepared in ready:
            self.hand_over(prepared.delivery)

    def _settle(self, outcomes: list[_Outcome]) -> None:
        mine = [item for item in outcomes if item.delivery.take_settlement()]
        # Not mine: given back by a shutdown meanwhile; its run was put back to queued.
        if not mine:
            return
        leases = [item.lease for item in mine if item.lease is not None]
        try:
            if leases and not self._commit(leases):
                self.processor.come_back_later([(item.delivery, item.outcome) for item in mine])
                return
        finally:
            self.processor.let_go_many([item.delivery for item in mine])
        # Committed: now the acks, all in one call (RabbitMQ: sent by its I/O thread
        # without waiting here; one that fails comes back and is skipped as a duplicate).
        deliveries = [item.delivery for item in mine]
        unacked = {id(d) for d in self.processor.consumer.ack_many(deliveries, wait=False)}
        for item in mine:
            failed = id(item.delivery) in unacked
            self.processor.settled(item.delivery, item.outcome, unsettled=failed)

    def _commit(self, leases: list[Lease]) -> bool:
        """The group commit, tried again while the database is away (the runs' leases are
        extended meanwhile): False when it never worked."""
        pause = COMMIT_RETRY_FIRST
        for attempt in range(1, COMMIT_ATTEMPTS + 1):
            try:
                self.commit_statements += 1
                marked = self.processor.ledger.succeeded_many(leases)
            except Exception as exc:
                log_failure(
                    logger,
                    exc,
                    "recording %d outcomes failed (attempt %d of %d)",
                    len(leases),
                    attempt,
                    COMMIT_ATTEMPTS,
                )
                connection.close()
                if aborted_by(exc) == "lock timeout":
                    # Rows another session keeps: waiting for them again would only wait
                    # as long once more. The messages come back later instead.
                    return False
                if attempt < COMMIT_ATTEMPTS:
                    time.sleep(pause)
                    pause *= 2
                continue
            if len(marked) < len(leases):
                # Taken over after the lease expired: the new holder records its own.
                lost = {lease.run_id for lease in leases} - marked
                logger.warning("runs taken over before their success was recorded: %s", lost)
            return True
        return False


def _nowhere(delivery: Delivery) -> None:
    raise RuntimeError("the window hands deliveries over to no slot")


class _Connection:
    """A bookkeeping thread's database connection: checked before use after a pause, let
    go of after a while with nothing to do, closed when the thread ends."""

    def __init__(self) -> None:
        self._used_at: float | None = None

    def __enter__(self) -> _Connection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        connection.close()

    def use(self) -> None:
        now = time.monotonic()
        if self._used_at is None or now - self._used_at > CHECK_AFTER_SECONDS:
            close_old_connections()
        self._used_at = now

    def idle(self) -> None:
        if self._used_at is not None and time.monotonic() - self._used_at > IDLE_CLOSE_SECONDS:
            connection.close()
            self._used_at = None
