"""Running one task message: the run's bookkeeping, the handler, and what follows a failure.

For each delivery: claim its run by ``run_id``, counting the receive and marking it
``running`` under a lease (one statement); run the handler; mark it ``succeeded`` and
ack. A run already ``succeeded`` or ``failed``: a duplicate, ack and skip. A run another
worker holds under a live lease: this copy is not run but given back for when the lease
ends (SQS: its visibility; RabbitMQ: its outbox row, then ack), by which time the holder
has finished (the copy is then skipped) or died (the copy takes the run over).

A failure is permanent when the handler says so (``PermanentError``, or a domain refusal:
``InvalidInput``, ``NotFound``, ``Forbidden``) or when this was the task's last receive
(``max_receives`` in ``tasks.json``, 5 by default): a copy goes to the dead-letter queue
with the error, ``TaskFailed`` is recorded in the trail, the run becomes ``failed``, and
only then is the original acked. Any other failure is transient: the run becomes
``retrying`` and the message comes back after an exponential backoff with jitter,
without holding a slot (SQS: its visibility; RabbitMQ: its outbox row is re-armed, due
after the backoff, and the message acked; see docs/worker.md).
"""

from __future__ import annotations

import logging
import random
import threading
import time
import traceback
import uuid
from collections import Counter
from typing import Any

from django.db import close_old_connections, connection

from common.context import reset_correlation_id, set_correlation_id
from outbox.catalog import RetryPolicy, UnknownTask, get_catalog
from outbox.runtime.errors import UnknownTaskHandler, is_permanent
from outbox.runtime.leases import LeaseKeeper
from outbox.runtime.ledger import Begin, Lease, RunLedger, new_holder, rearm_outbox_row
from outbox.runtime.registry import TaskMessage, get_handler
from relay.transports.base import TransportUnavailable
from relay.transports.consume import (
    BadMessage,
    Consumer,
    Delivery,
    FailureContext,
    heartbeat_interval,
    visibility_timeout,
)

logger = logging.getLogger("hubdommed.worker")

# When the bookkeeping itself fails (the database is away), the message comes back after
# this long, without counting as a failure of the task.
INFRASTRUCTURE_RETRY_SECONDS = 5.0
# A copy given back because another worker holds its run comes back this long after the
# holder's lease would end (SQS counts in whole seconds; the relay sweeps).
LEASE_MARGIN_SECONDS = 1.0


def backoff_with_jitter(policy: RetryPolicy, receive_count: int) -> float:
    """Exponential backoff with "equal jitter": between half and all of the step, so
    delays still grow from one retry to the next while retries of many messages spread."""
    step = policy.backoff(receive_count)
    return step / 2 + random.uniform(0, step / 2)


class TaskProcessor:
    def __init__(self, consumer: Consumer, ledger: RunLedger | None = None) -> None:
        self.consumer = consumer
        self.ledger = ledger or RunLedger()
        self.leases = LeaseKeeper(self.ledger)
        self.outcomes: Counter[str] = Counter()
        # The runs this process claimed, by the delivery that claimed them.
        self._claims: dict[Delivery, Lease] = {}
        self._claims_lock = threading.Lock()

    def process(self, delivery: Delivery) -> None:
        # A connection the database dropped while this thread was idle (a restart, a
        # terminated backend) is replaced before the claim, not found dead by it (with
        # CONN_HEALTH_CHECKS the first query after this checks it).
        close_old_connections()
        try:
            self._process(delivery)
        except Exception as exc:
            # The bookkeeping before the handler failed (the database is away, say).
            logger.exception("bookkeeping for %s failed; it will come back", delivery.run_id)
            self._settle(delivery, "infrastructure", self._come_back_later, exc)
        finally:
            # Each worker thread keeps its own connection; drop it if it went bad or old.
            close_old_connections()

    def thread_done(self) -> None:
        connection.close()

    def released(self, delivery: Delivery) -> None:
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

    def _process(self, delivery: Delivery) -> None:
        try:
            envelope = _checked_envelope(delivery)
        except BadMessage as exc:
            failure = FailureContext.from_exception(
                exc, receive_count=delivery.broker_receive_count, tb=""
            )
            logger.error("unreadable message %s dead-lettered: %s", delivery.message_id, exc)
            self._settle(delivery, "unreadable", self._park, None, failure)
            return
        lease = Lease(
            run_id=str(uuid.UUID(str(envelope["run_id"]))),
            holder=new_holder(),
            seconds=visibility_timeout(delivery.destination),
            interval=heartbeat_interval(delivery.destination),
        )
        started = self.ledger.begin(envelope, holder=lease.holder, lease=lease.seconds)
        if started.decision is Begin.SKIP:
            # Delivered again after it finished: consumers are idempotent by run_id.
            self._settle(delivery, "duplicate", self.consumer.ack)
            return
        if started.decision is Begin.BUSY:
            delay = started.lease_remaining + LEASE_MARGIN_SECONDS
            logger.info(
                "run %s is held by another worker; this copy comes back in %.1f s",
                lease.run_id,
                delay,
            )
            self._settle(delivery, "busy", self._later, envelope, delay)
            return
        if not self._hold(delivery, lease):
            # Given back by a shutdown while it was being claimed: not run here.
            self.ledger.requeued(lease.run_id, holder=lease.holder)
            return
        try:
            self._run(delivery, envelope, lease, started.receive_count)
        finally:
            self._let_go(delivery)

    def _run(self, delivery: Delivery, envelope: dict[str, Any], lease: Lease, receive_count: int):
        task = envelope["task"]
        policy = RetryPolicy()
        token = set_correlation_id(envelope.get("correlation_id") or str(envelope["run_id"]))
        try:
            spec = get_catalog().task(task)
            policy = spec.retry
            handler = get_handler(task)
            if handler is None:
                raise UnknownTaskHandler(f"no handler is registered for task {task!r}")
            handler(_task_message(envelope, receive_count))
        except Exception as exc:
            tb = traceback.format_exc()
            self._failed(delivery, envelope, lease, exc, tb, receive_count, policy)
        else:
            self._settle(delivery, "succeeded", self._succeeded, envelope)
        finally:
            reset_correlation_id(token)

    def _hold(self, delivery: Delivery, lease: Lease) -> bool:
        with self._claims_lock:
            if delivery.settled:
                return False
            self._claims[delivery] = lease
        self.leases.hold(lease)
        return True

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
    ) -> None:
        error = f"{type(exc).__name__}: {exc}"
        permanent = is_permanent(exc) or isinstance(exc, UnknownTask)
        if permanent or receive_count >= policy.max_receives:
            why = "permanent error" if permanent else f"receive {receive_count}, the last"
            logger.warning(
                "task %s run %s failed (%s): %s", envelope["task"], envelope["run_id"], why, error
            )
            failure = FailureContext.from_exception(exc, receive_count=receive_count, tb=tb)
            self._settle(delivery, "failed", self._park, envelope, failure)
            return
        delay = backoff_with_jitter(policy, receive_count)
        logger.info(
            "task %s run %s failed on receive %d, retrying in %.2f s: %s",
            envelope["task"],
            envelope["run_id"],
            receive_count,
            delay,
            error,
        )
        self._settle(delivery, "retrying", self._retry, envelope, lease, error, delay)

    # -- settling (exactly once per delivery) ----------------------------------------------

    def _settle(self, delivery: Delivery, outcome: str, action, *args) -> None:
        with delivery.settling() as mine:
            if not mine:
                # Given back by a shutdown meanwhile; its run was put back to queued.
                return
            try:
                action(delivery, *args)
            except TransportUnavailable as exc:
                # The broker brings the message back by itself (connection gone, visibility).
                logger.warning("could not settle %s (%s): %s", delivery.run_id, outcome, exc)
                outcome = f"{outcome}-unsettled"
            except Exception:
                # The bookkeeping failed (the database is away): give the message back for
                # later, so that it neither sits unsettled nor holds a slot.
                logger.exception(
                    "could not settle %s (%s); it will come back", delivery.run_id, outcome
                )
                outcome = f"{outcome}-infrastructure"
                try:
                    self._come_back_later(delivery, None)
                except TransportUnavailable as exc:
                    logger.warning("could not give back %s: %s", delivery.run_id, exc)
            self.outcomes[outcome] += 1

    def _succeeded(self, delivery: Delivery, envelope: dict[str, Any]) -> None:
        # Committed before the ack: a crash in between delivers a copy that is skipped.
        self.ledger.succeeded(envelope["run_id"])
        self.consumer.ack(delivery)

    def _retry(
        self,
        delivery: Delivery,
        envelope: dict[str, Any],
        lease: Lease,
        error: str,
        delay: float,
    ) -> None:
        if self.consumer.can_delay:
            self.ledger.retrying(
                envelope, holder=lease.holder, error=error, delay=delay, rearm=False
            )
            self.consumer.retry_later(delivery, delay)
        else:
            # The outbox row comes due again after the delay and the relay re-sends it;
            # nothing holds a slot or a broker-side timer meanwhile.
            self.ledger.retrying(
                envelope, holder=lease.holder, error=error, delay=delay, rearm=True
            )
            self.consumer.ack(delivery)

    def _later(self, delivery: Delivery, envelope: dict[str, Any], delay: float) -> None:
        """A copy of a run another worker holds: back when the holder's lease would end."""
        if self.consumer.can_delay:
            self.consumer.retry_later(delivery, delay)
        else:
            # Acked only once its outbox row is due again: if the holder dies, this copy
            # (maybe the holder's own message, requeued by the broker when its connection
            # dropped) still comes back, after the lease expired.
            rearm_outbox_row(envelope, delay=delay, keep_earlier=True)
            self.consumer.ack(delivery)

    def _park(
        self, delivery: Delivery, envelope: dict[str, Any] | None, failure: FailureContext
    ) -> None:
        # The copy first, then the record, then the ack: a crash in between delivers the
        # original again, which finds its run failed and is only acked.
        self.consumer.dead_letter(delivery, failure)
        if envelope is not None:
            self.ledger.failed(envelope, failure=failure)
        self.consumer.ack(delivery)

    def _come_back_later(self, delivery: Delivery, _exc: Exception | None) -> None:
        if not self.consumer.can_delay:
            # It would come back at once: do not spin on a database that is away.
            time.sleep(1.0)
        self.consumer.retry_later(delivery, INFRASTRUCTURE_RETRY_SECONDS)


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
