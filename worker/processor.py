"""Running one task message: the run's bookkeeping, the handler, and what follows a failure.

For each delivery: claim its run by ``run_id``, counting the receive and marking it
``running`` under a lease; run the handler; mark it ``succeeded`` and ack. The claims of
the deliveries received together are made together, and the successes of many slots are
committed together before their acks (``worker.window``). A run already ``succeeded`` or
``failed``: a duplicate, ack and skip. A run another worker holds under a live lease: this
copy is not run but given back for when the lease ends (SQS: its visibility; RabbitMQ:
its outbox row, then ack), by which time the holder has finished (the copy is then
skipped) or died (the copy takes the run over).

A handler that runs longer than its task's time limit (``time_limit_seconds`` in
``tasks.json``) is abandoned: its run is retried like after a transient failure, its
lease is no longer extended, and its slot is given to a new thread. Whatever the
abandoned handler does when it returns is ignored (its delivery is settled already, and
a success is recorded only by the run's current holder).

A failure is permanent when the handler says so (``PermanentError``, or a domain refusal:
``InvalidInput``, ``NotFound``, ``Forbidden``) or when this was the task's last receive
(``max_receives`` in ``tasks.json``, 5 by default): a copy goes to the dead-letter queue
with the error, ``TaskFailed`` is recorded in the trail, the run becomes ``failed``, and
only then is the original acked. Any other failure is transient: the run becomes
``retrying`` and the message comes back after an exponential backoff with jitter,
without holding a slot (SQS: its visibility; RabbitMQ: its outbox row is re-armed, due
after the backoff, and the message acked; see docs/worker.md).

This module is the loop over those steps only. Beside it, chosen once when the worker is
built: what a failure means (``worker.retries``), how a message comes back later
(``worker.come_back``), and what an outcome is (``worker.outcomes``).
"""

from __future__ import annotations

import logging
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from django.db import DEFAULT_DB_ALIAS, close_old_connections, connection, connections

from broker import topology
from broker.base import TransportUnavailable
from broker.consume import (
    BadMessage,
    Consumer,
    Delivery,
    FailureContext,
    heartbeat_interval,
    visibility_timeout,
)
from common import tracing
from common.context import log_context
from common.jsondata import storable_text
from lifecycle.failures import log_failure
from outbox.catalog import DEFAULT_TIME_LIMIT_SECONDS, RetryPolicy, get_catalog
from outbox.handlers import TaskMessage, get_handler
from outbox.runs import (
    Begin,
    Lease,
    RunLedger,
    Started,
    canonical_run_id,
    held_here,
    new_holder,
)
from outbox.task_errors import UnknownTaskHandler
from worker import metrics, retries
from worker.come_back import ComeBack, for_consumer
from worker.leases import AHEAD_LEASE_SECONDS, LeaseKeeper, Start, ahead_seconds
from worker.outcomes import Outcome, Settling
from worker.window import MAX_SLEEP as WINDOW_MAX_SLEEP
from worker.window import Prepared, RunWindow

logger = logging.getLogger("hubdommed.worker")

# A copy given back because another worker holds its run comes back this long after the
# holder's lease would end (SQS counts in whole seconds; the relay sweeps).
LEASE_MARGIN_SECONDS = 1.0
# A copy put aside because another process holds its run under a lease about to end is
# claimed again this long after that lease would end.
CLAIM_AGAIN_MARGIN_SECONDS = 0.25


# A message delivered this many times (of the broker's ``MAX_RECEIVES`` before its redrive)
# is replaced by a fresh copy from its outbox row, not held. Two deliveries short of the
# last: a message can be returned where the worker never sees it (in flight when its
# worker died, or when it stopped consuming), so the last one is too late to act on.
RENEW_FROM_DELIVERY = topology.MAX_RECEIVES - 2
# A run claimed more often than this many times its task's receives (or the broker's
# limit, if more) has had its workers die on it, or give it back, every time: it is not
# run again but dead-lettered (``ReceivedTooOften``).
RECEIVED_TOO_OFTEN_FACTOR = 3


class ReceivedTooOften(Exception):
    """The run was claimed far more often than its task may be received, never to a
    finish: its workers died on it (or gave it back) every time."""


class TimeLimitExceeded(Exception):
    """The handler ran longer than its task's time limit: abandoned, retried."""


@dataclass(eq=False)
class _Running:
    """A handler in progress, watched for its time limit."""

    delivery: Delivery
    thread: threading.Thread
    deadline: float
    limit: float
    envelope: dict[str, Any]
    lease: Lease
    receive_count: int
    policy: RetryPolicy


class TaskProcessor:
    def __init__(
        self,
        consumer: Consumer,
        ledger: RunLedger | None = None,
        *,
        come_back: ComeBack | None = None,
    ) -> None:
        self.consumer = consumer
        self.ledger = ledger or RunLedger()
        # How a message not settled now comes back: what this consumer's broker allows.
        self.come_back = come_back or for_consumer(consumer, self.ledger)
        self.leases = LeaseKeeper(self.ledger)
        # What became of the messages, by ``Outcome.key`` (the worker's summary line).
        self.outcomes: Counter[str] = Counter()
        # The runs this process claimed, by the delivery that claimed them.
        self._claims: dict[Delivery, Lease] = {}
        self._claims_lock = threading.Lock()
        self.window = RunWindow(self)
        # Handlers in progress, for their time limits.
        self._running: dict[Delivery, _Running] = {}
        # Metrics' children by family and label values (``_metric``).
        self._metric_children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # Runs claimed ahead of their slot are held under a short lease where the broker
        # gives a dead worker's messages back at once (``worker.leases``).
        self.ahead = bool(getattr(consumer, "returns_unsettled_at_once", False))
        # Called with a slot's thread stuck in a handler past its time limit, once its
        # delivery is settled: the consume loop replaces the slot (``replace_slot``).
        self.on_abandon: Callable[[threading.Thread, Delivery], None] | None = None

    # -- the consume loop's hooks ------------------------------------------------------------

    def received(self, deliveries: list[Delivery]) -> None:
        """Deliveries just received: their runs are claimed together, ahead of the slots."""
        self.window.prepare(deliveries)

    def unsettled(self) -> int:
        """Outcomes handed over for the group commit and not acked yet."""
        return self.window.unsettled()

    def process(self, delivery: Delivery) -> None:
        # A connection the database dropped while this thread was idle (a restart, a
        # terminated backend) is replaced before it is used, not found dead by it (with
        # CONN_HEALTH_CHECKS the first query after this checks it). A slot whose handlers
        # never touched the database has none to check.
        db = _thread_database()
        if db.connection is not None:
            close_old_connections()
        try:
            self._process(delivery)
        except Exception as exc:
            # The bookkeeping before the handler failed (the database is away, say).
            log_failure(
                logger, exc, "bookkeeping for %s failed; it will come back", delivery.run_id
            )
            self._settle(delivery, Outcome.INFRASTRUCTURE, self.come_back.infrastructure)
        finally:
            # Each worker thread keeps its own connection; drop it if it went bad or old.
            if db.connection is not None:
                close_old_connections()

    def thread_done(self) -> None:
        connection.close()

    def stopped(self) -> None:
        # What the loop did not finish was given back: the bookkeeping threads end.
        self.window.close()
        self.leases.close()

    def released(self, delivery: Delivery) -> None:
        self.window.forget(delivery)
        lease = self._let_go(delivery)
        if lease is None:
            # Not claimed (yet): whoever claims it finds it given back and lets go.
            return
        close_old_connections()
        try:
            self.ledger.requeued(lease.run_id, holder=lease.holder)
        finally:
            close_old_connections()

    # -- one message ---------------------------------------------------------------------

    def claim_window(self, batch: list[Prepared]) -> list[Prepared]:
        """Claim the runs of a window of deliveries in one statement (the bookkeeping
        thread calls it); the runs claimed are held (their leases extended) at once.
        Returns what goes to a slot: the deliveries whose run is claimed, and those a slot
        settles (unreadable); the others are settled here, or put aside (``_busy``)."""
        ready: list[Prepared] = []
        wanted: list[Prepared] = []
        # Each destination's lease and heartbeat (settings read once per window).
        timings: dict[str, tuple[float, float]] = {}
        for prepared in batch:
            prepared.started = None
            if prepared.lease is not None:
                # Tried again (after a dropped connection, or put aside): the same holder,
                # so that a claim an earlier attempt made is recognised as this one's.
                wanted.append(prepared)
                continue
            delivery = prepared.delivery
            try:
                prepared.envelope = _checked_envelope(delivery)
            except BadMessage as exc:
                prepared.error = exc
                ready.append(prepared)
                continue
            if delivery.broker_receive_count >= RENEW_FROM_DELIVERY:
                # Returned to its queue so often (windows given back at shutdown, workers
                # that died with it, lost connections) that a few more returns, whatever
                # causes them, and the broker dead-letters it: held here, a crash would
                # leave its run with no message at all. A fresh copy takes its place.
                logger.info(
                    "message of run %s near its last delivery (%d); replaced by a fresh copy",
                    delivery.run_id,
                    delivery.broker_receive_count,
                )
                self._settle(delivery, Outcome.RENEWED, self.come_back.afresh, prepared.envelope)
                continue
            destination = delivery.destination
            timing = timings.get(destination)
            if timing is None:
                timing = timings[destination] = (
                    visibility_timeout(destination),
                    heartbeat_interval(destination),
                )
            prepared.lease = Lease(
                run_id=canonical_run_id(prepared.envelope["run_id"]),
                holder=new_holder(),
                seconds=timing[0],
                interval=timing[1],
            )
            wanted.append(prepared)
        if not wanted:
            return ready
        ahead = self.ahead
        claimed_at = time.monotonic()
        started = self.ledger.begin_many(
            [
                (
                    p.envelope,
                    p.lease.holder,  # type: ignore[union-attr]
                    ahead_seconds(p.lease) if ahead else p.lease.seconds,  # type: ignore[arg-type]
                )
                for p in wanted
            ]
        )
        held: list[Prepared] = []
        for prepared in wanted:
            lease = prepared.lease
            assert lease is not None
            prepared.started = decision = started[lease.holder]
            if decision.decision is Begin.RUN:
                if (
                    decision.receive_count > RECEIVED_TOO_OFTEN_FACTOR * topology.MAX_RECEIVES
                    and self._received_too_often(prepared, decision.receive_count)
                ):
                    continue
                held.append(prepared)
            elif decision.decision is Begin.SKIP:
                # Delivered again after it finished: consumers are idempotent by run_id.
                self.window.settle(prepared.delivery, None, Outcome.DUPLICATE)
            else:
                self._busy(prepared, decision)
        if held:
            ready += self._hold_many(held, confirmed_at=claimed_at)
        return ready

    def _busy(self, prepared: Prepared, decision: Started) -> None:
        """A copy of a run someone holds under a live lease: not run here now. Settled at
        once (it must not wait for a slot behind the very run it waits for), except a run
        another process holds under a lease that ends within seconds (claimed ahead by a
        worker that may have died with it): claimed again then, once, without a slot."""
        lease = prepared.lease
        assert lease is not None and prepared.envelope is not None
        if (
            not prepared.parked
            and decision.held_by
            and not held_here(decision.held_by)
            and decision.lease_remaining <= AHEAD_LEASE_SECONDS
        ):
            self.window.park(
                prepared, time.monotonic() + decision.lease_remaining + CLAIM_AGAIN_MARGIN_SECONDS
            )
            return
        delay = decision.lease_remaining + LEASE_MARGIN_SECONDS
        logger.info(
            "run %s is held by another worker; this copy comes back in %.1f s",
            lease.run_id,
            delay,
        )
        self._settle(prepared.delivery, Outcome.BUSY, self.come_back.busy, prepared.envelope, delay)

    def _received_too_often(self, prepared: Prepared, receive_count: int) -> bool:
        """A run claimed far more often than its task allows: dead-lettered, not run
        (True). The broker's redrive cannot end it: each copy that finds it held by a
        dead worker comes back afresh."""
        envelope = prepared.envelope
        assert envelope is not None
        try:
            max_receives = get_catalog().task(envelope["task"]).retry.max_receives
        except Exception:  # an unknown task: its own failure follows when it runs
            max_receives = 0
        limit = RECEIVED_TOO_OFTEN_FACTOR * max(topology.MAX_RECEIVES, max_receives)
        if receive_count <= limit:
            return False
        exc = ReceivedTooOften(
            f"run {envelope['run_id']} was received {receive_count} times (more than "
            f"{limit}) without finishing: its workers died on it, or gave it back, each time"
        )
        logger.error("task %s %s; dead-lettered", envelope["task"], exc)
        failure = _failure_context(exc, receive_count=receive_count, tb="")
        self._settle(prepared.delivery, Outcome.FAILED, self._park, envelope, failure)
        return True

    def _hold_many(self, batch: list[Prepared], *, confirmed_at: float) -> list[Prepared]:
        """Keep the leases of these runs just claimed; returns those to run (a delivery a
        shutdown gave back meanwhile is not: its run is put back here)."""
        kept: list[Prepared] = []
        given_back: list[Prepared] = []
        with self._claims_lock:
            for prepared in batch:
                if prepared.delivery.settled:
                    prepared.given_back = True
                    given_back.append(prepared)
                else:
                    self._claims[prepared.delivery] = prepared.lease  # type: ignore[assignment]
                    kept.append(prepared)
        self.leases.hold_many(
            [p.lease for p in kept],  # type: ignore[misc]
            ahead=self.ahead,
            confirmed_at=confirmed_at,
        )
        for prepared in given_back:
            lease = prepared.lease
            assert lease is not None
            self.ledger.requeued(lease.run_id, holder=lease.holder)
        return kept

    def _process(self, delivery: Delivery) -> None:
        prepared = self.window.take(delivery)
        if prepared is None:
            if delivery.settled:
                # Given back by a shutdown between its claim and its slot.
                return
            raise RuntimeError(f"no claim for {delivery.run_id}")
        if isinstance(prepared.error, BadMessage):
            failure = _failure_context(
                prepared.error, receive_count=delivery.broker_receive_count, tb=""
            )
            logger.error(
                "unreadable message %s dead-lettered: %s", delivery.message_id, prepared.error
            )
            self._settle(delivery, Outcome.UNREADABLE, self._park, None, failure)
            return
        if prepared.error is not None:
            raise prepared.error
        envelope, lease, started = prepared.envelope, prepared.lease, prepared.started
        assert envelope is not None and lease is not None and started is not None
        if not self._start(delivery, envelope, lease):
            return
        payload = envelope.get("payload")
        job_id = payload.get("job_id") if isinstance(payload, dict) else None
        with log_context(
            correlation_id=envelope.get("correlation_id") or str(envelope["run_id"]),
            run_id=lease.run_id,
            job_id=job_id,
            tenant_id=envelope.get("tenant"),
        ):
            self._run(delivery, envelope, lease, started.receive_count)

    def _start(self, delivery: Delivery, envelope: dict[str, Any], lease: Lease) -> bool:
        """The slot starts the run: from now on held under its full lease. False: not to be
        run here (given back meanwhile, or taken over: its delivery is settled)."""
        state = self.leases.start(lease)
        if state is Start.STARTED:
            return True
        if state is Start.NOT_HELD or delivery.settled:
            # Given back by a shutdown meanwhile, its run put back to queued.
            return False
        # No beat kept its short lease lately (the database slow or away, this process
        # stalled): confirmed here first, or not run.
        began = time.monotonic()
        try:
            kept = self.ledger.extend([lease])
        except Exception:
            self._let_go(delivery)
            raise
        if lease.holder in kept and self.leases.start(lease, confirmed_at=began) is Start.STARTED:
            return True
        self._let_go(delivery)
        delay = ahead_seconds(lease) + LEASE_MARGIN_SECONDS
        logger.warning(
            "run %s was taken over before it started here; this copy comes back in %.1f s",
            lease.run_id,
            delay,
        )
        self._settle(delivery, Outcome.BUSY, self.come_back.busy, envelope, delay)
        return False

    def _run(self, delivery: Delivery, envelope: dict[str, Any], lease: Lease, receive_count: int):
        task = envelope["task"]
        policy = RetryPolicy()
        limit = DEFAULT_TIME_LIMIT_SECONDS
        began = time.monotonic()
        outcome = Outcome.SUCCEEDED
        abandoned = False
        try:
            spec = get_catalog().task(task)
            policy, limit = spec.retry, spec.time_limit_seconds
            handler = get_handler(task)
            if handler is None:
                raise UnknownTaskHandler(f"no handler is registered for task {task!r}")
            running = _Running(
                delivery,
                threading.current_thread(),
                began + limit,
                limit,
                envelope,
                lease,
                receive_count,
                policy,
            )
            with self._claims_lock:
                self._running[delivery] = running
            if limit < WINDOW_MAX_SLEEP:
                # Sooner than the claiming thread's next look at the time limits.
                self.window.wake()
            try:
                traceparent = envelope.get("traceparent")
                if traceparent and tracing.active():
                    with tracing.span(
                        f"worker.run {task}",
                        traceparent=traceparent,
                        kind=tracing.SpanKind.CONSUMER,
                        attributes={
                            "messaging.operation.type": "process",
                            "messaging.destination.name": envelope.get("destination"),
                            "hubdommed.task": task,
                            "hubdommed.run_id": lease.run_id,
                            "hubdommed.attempt": receive_count,
                        },
                    ):
                        handler(_task_message(envelope, receive_count))
                else:
                    handler(_task_message(envelope, receive_count))
            finally:
                with self._claims_lock:
                    abandoned = self._running.pop(delivery, None) is None
                # Its outcome is recorded next: a beat that finds the run settled
                # meanwhile has lost nothing.
                self.leases.settling(lease)
        except Exception as exc:
            if abandoned:
                # Past its time limit: the run was retried without it.
                return
            outcome = self._failed(
                delivery, envelope, lease, exc, traceback.format_exc(), receive_count, policy
            )
            self._let_go(delivery)
        else:
            if abandoned:
                # Past its time limit: the run was retried without it; its result is moot.
                logger.warning("task %s run %s returned after it was abandoned", task, lease.run_id)
                return
            # Committed with others before the ack (``worker.window``); the lease is held
            # until then.
            self.window.settle(delivery, lease, Outcome.SUCCEEDED)
        duration = time.monotonic() - began
        self._metric(metrics.TASK_RUN_DURATION, task).observe(duration)
        if logger.isEnabledFor(logging.INFO):
            logger.info(
                "task run finished",
                extra={
                    "task": task,
                    "outcome": outcome.metric,
                    "duration": round(duration, 6),
                    # The run's trace (its span is over by now), while tracing is on.
                    "trace_id": tracing.trace_id_of(envelope.get("traceparent")),
                },
            )

    # -- time limits (the bookkeeping thread) ----------------------------------------------

    def until_next_deadline(self) -> float:
        with self._claims_lock:
            if not self._running:
                return float("inf")
            soonest = min(running.deadline for running in self._running.values())
        return max(0.0, soonest - time.monotonic())

    def abandon_expired(self) -> None:
        """Handlers past their time limit: their runs are retried (or dead-lettered on
        their last receive), their leases let go, their slots replaced."""
        now = time.monotonic()
        with self._claims_lock:
            if not self._running:
                return
            expired = [r for r in self._running.values() if r.deadline <= now]
            for running in expired:
                del self._running[running.delivery]
        for running in expired:
            task = running.envelope["task"]
            logger.warning(
                "task %s run %s exceeded its time limit of %.1f s: abandoned",
                task,
                running.lease.run_id,
                running.limit,
            )
            metrics.TASK_RUNS.labels(task=task, outcome="timed_out").inc()
            exc = TimeLimitExceeded(f"task {task} ran longer than {running.limit:g} s")
            # Its lease is no longer extended; the retry below is recorded by its holder.
            self._let_go(running.delivery)
            self._failed(
                running.delivery,
                running.envelope,
                running.lease,
                exc,
                "",
                running.receive_count,
                running.policy,
            )
            if self.on_abandon is not None:
                self.on_abandon(running.thread, running.delivery)

    # -- group settlement (the bookkeeping thread) -----------------------------------------

    def let_go_many(self, deliveries: list[Delivery]) -> None:
        with self._claims_lock:
            leases = [
                lease
                for lease in (self._claims.pop(delivery, None) for delivery in deliveries)
                if lease is not None
            ]
        self.leases.drop_many(leases)

    def settled(self, delivery: Delivery, outcome: Outcome, *, unsettled: bool = False) -> None:
        self._count(delivery, outcome, Settling.UNSETTLED if unsettled else None)

    def come_back_later(self, settled: list[tuple[Delivery, Outcome]]) -> None:
        """The bookkeeping of these outcomes failed (the database is away): back for later."""
        for delivery, outcome in settled:
            try:
                self.come_back.infrastructure(delivery)
            except TransportUnavailable as exc:
                logger.warning("could not give back %s: %s", delivery.run_id, exc)
            self._count(delivery, outcome, Settling.INFRASTRUCTURE)

    def _count(self, delivery: Delivery, outcome: Outcome, settling: Settling | None = None):
        self.outcomes[outcome.key(settling)] += 1
        name = outcome.metric if settling is None else None
        if name is not None:
            try:
                task = str(delivery.envelope.get("task", "?"))
            except BadMessage:
                task = "?"
            self._metric(metrics.TASK_RUNS, task, name).inc()

    def _metric(self, family, *labels: str):
        """A metric's child for these label values, looked up once (labels of low
        cardinality: tasks and outcomes)."""
        key = (id(family), labels)
        child = self._metric_children.get(key)
        if child is None:
            child = self._metric_children[key] = family.labels(*labels)
        return child

    def _let_go(self, delivery: Delivery) -> Lease | None:
        with self._claims_lock:
            lease = self._claims.pop(delivery, None)
        if lease is not None:
            self.leases.drop(lease)
        return lease

    def _failed(
        self,
        delivery: Delivery,
        envelope: dict[str, Any],
        lease: Lease,
        exc: Exception,
        tb: str,
        receive_count: int,
        policy: RetryPolicy,
    ) -> Outcome:
        """Report the failure to the policy (``worker.retries``) and do what it decided."""
        # The run's ``last_error``: storable, as ``_failure_context`` says why.
        error = storable_text(f"{type(exc).__name__}: {exc}")
        decision = retries.after_failure(exc, receive_count=receive_count, policy=policy)
        if not decision.retry:
            logger.warning(
                "task %s run %s failed (%s): %s",
                envelope["task"],
                envelope["run_id"],
                decision.why,
                error,
            )
            failure = _failure_context(exc, receive_count=receive_count, tb=tb)
            self._settle(delivery, Outcome.FAILED, self._park, envelope, failure)
            return Outcome.FAILED
        logger.info(
            "task %s run %s failed on receive %d, retrying in %.2f s: %s",
            envelope["task"],
            envelope["run_id"],
            receive_count,
            decision.delay,
            error,
        )
        self._settle(
            delivery, Outcome.RETRYING, self.come_back.retry, envelope, lease, error, decision.delay
        )
        return Outcome.RETRYING

    # -- settling (exactly once per delivery) ----------------------------------------------

    def _settle(self, delivery: Delivery, outcome: Outcome, action, *args) -> None:
        """Settle ``delivery`` with ``action(delivery, *args)``, once: a delivery a shutdown
        gave back meanwhile is left alone."""
        with delivery.settling() as mine:
            if not mine:
                # Given back by a shutdown meanwhile; its run was put back to queued.
                return
            settling = None
            try:
                action(delivery, *args)
            except TransportUnavailable as exc:
                # The broker brings the message back by itself (connection gone, visibility).
                logger.warning("could not settle %s (%s): %s", delivery.run_id, outcome, exc)
                settling = Settling.UNSETTLED
            except Exception as exc:
                # The bookkeeping failed (the database is away): give the message back for
                # later, so that it neither sits unsettled nor holds a slot.
                log_failure(
                    logger,
                    exc,
                    "could not settle %s (%s); it will come back",
                    delivery.run_id,
                    outcome,
                )
                settling = Settling.INFRASTRUCTURE
                try:
                    self.come_back.infrastructure(delivery)
                except TransportUnavailable as exc:
                    logger.warning("could not give back %s: %s", delivery.run_id, exc)
            self._count(delivery, outcome, settling)

    def _park(
        self, delivery: Delivery, envelope: dict[str, Any] | None, failure: FailureContext
    ) -> None:
        # The copy first, then the record, then the ack: a crash in between delivers the
        # original again, which finds its run failed and is only acked.
        self.consumer.dead_letter(delivery, failure)
        metrics.DEAD_LETTERED.labels(queue=delivery.destination).inc()
        if envelope is not None:
            self.ledger.failed(envelope, failure=failure)
        self.consumer.ack(delivery)


_slot = threading.local()


def _thread_database():
    """This thread's database connection (Django's, for the default database), looked up
    once per thread: a slot asks for it twice per message."""
    db = getattr(_slot, "db", None)
    if db is None:
        db = _slot.db = connections[DEFAULT_DB_ALIAS]
    return db


def _failure_context(exc: BaseException, *, receive_count: int, tb: str) -> FailureContext:
    """Why the run failed, its message and traceback storable (U+0000 and lone
    surrogates as U+FFFD).

    A handler's exception may quote anything (a library its input, a receiver its
    answer): PostgreSQL refuses U+0000 in the run's ``last_error`` and in ``TaskFailed``'s
    payload, SQS in the dead letter's attributes, and a lone surrogate cannot even be
    encoded. A record that fails leaves the run unsettled, to come back and fail the same
    way again and again.
    """
    failure = FailureContext.from_exception(exc, receive_count=receive_count, tb=tb)
    return replace(
        failure,
        message=storable_text(failure.message),
        traceback=storable_text(failure.traceback),
    )


def _checked_envelope(delivery: Delivery) -> dict[str, Any]:
    envelope = delivery.envelope
    try:
        uuid.UUID(str(envelope.get("run_id")))
    except ValueError:
        raise BadMessage("the envelope has no valid run_id") from None
    if not isinstance(envelope.get("task"), str) or not envelope["task"]:
        raise BadMessage("the envelope names no task")
    if not isinstance(envelope.get("payload", {}), dict):
        raise BadMessage("the envelope's payload is not an object")
    return envelope


def _task_message(envelope: dict[str, Any], receive_count: int) -> TaskMessage:
    return TaskMessage(
        run_id=uuid.UUID(str(envelope["run_id"])),
        task=envelope["task"],
        payload=dict(envelope.get("payload") or {}),
        tenant=envelope.get("tenant"),
        receive_count=receive_count,
        event=envelope.get("event"),
        event_id=envelope.get("event_id"),
        correlation_id=envelope.get("correlation_id") or "",
        envelope=envelope,
    )
