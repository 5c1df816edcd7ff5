"""How a message the worker does not settle now comes back later: one strategy a
transport, chosen once when the worker is built (``for_consumer``).

- ``BrokerDelay`` (SQS): the broker holds the message back itself, through its visibility;
- ``OutboxRearm`` (RabbitMQ, which cannot delay one message): the run's outbox row is made
  due again after the delay and the message acked; the relay sends it again then, and
  nothing holds a slot or a broker-side timer meanwhile.

Three things come back this way: a transient failure's retry, a copy of a run another
worker holds (back when that lease would end), and a message whose bookkeeping failed
(the database is away: back in a few seconds, not counted as a failure of the task).

A fourth comes back the same way on both transports (``afresh``): a message on its last
delivery before the broker's redrive, which the worker must not hold (see
``worker.processor``), is replaced by a new message from its outbox row.
"""

from __future__ import annotations

import time
from typing import Any

from broker.consume import Consumer, Delivery
from outbox.rearm import rearm_outbox_row
from outbox.runs import Lease, RunLedger

# When the bookkeeping itself fails (the database is away), the message comes back after
# this long, without counting as a failure of the task.
INFRASTRUCTURE_RETRY_SECONDS = 5.0


class BrokerDelay:
    """The broker delays the message (``consumer.can_delay``)."""

    def __init__(self, consumer: Consumer, ledger: RunLedger) -> None:
        self.consumer = consumer
        self.ledger = ledger

    def retry(
        self, delivery: Delivery, envelope: dict[str, Any], lease: Lease, error: str, delay: float
    ) -> None:
        """A transient failure: the run ``retrying``, the message back after ``delay``."""
        self.ledger.retrying(envelope, holder=lease.holder, error=error, delay=delay, rearm=False)
        self.consumer.retry_later(delivery, delay)

    def busy(self, delivery: Delivery, envelope: dict[str, Any], delay: float) -> None:
        """A copy of a run another worker holds: back when the holder's lease would end."""
        self.consumer.retry_later(delivery, delay)

    def infrastructure(self, delivery: Delivery) -> None:
        """The bookkeeping failed: back for later."""
        self.consumer.retry_later(delivery, INFRASTRUCTURE_RETRY_SECONDS)

    def afresh(self, delivery: Delivery, envelope: dict[str, Any]) -> None:
        """Replaced by a fresh copy: its outbox row due now (or sooner if planned so), the
        relay sends it again, a new message with no returns counted; then acked."""
        rearm_outbox_row(envelope, delay=0, keep_earlier=True)
        self.consumer.ack(delivery)


class OutboxRearm(BrokerDelay):
    """The outbox row comes due again and the relay re-sends it; the message is acked."""

    def retry(
        self, delivery: Delivery, envelope: dict[str, Any], lease: Lease, error: str, delay: float
    ) -> None:
        self.ledger.retrying(envelope, holder=lease.holder, error=error, delay=delay, rearm=True)
        self.consumer.ack(delivery)

    def busy(self, delivery: Delivery, envelope: dict[str, Any], delay: float) -> None:
        # Acked only once its outbox row is due again: if the holder dies, this copy
        # (maybe the holder's own message, requeued by the broker when its connection
        # dropped) still comes back, after the lease expired.
        rearm_outbox_row(envelope, delay=delay, keep_earlier=True)
        self.consumer.ack(delivery)

    def infrastructure(self, delivery: Delivery) -> None:
        # The broker cannot delay it: it would come back at once, so do not spin on a
        # database that is away. (No row can be re-armed: the database is the trouble.)
        time.sleep(1.0)
        self.consumer.retry_later(delivery, INFRASTRUCTURE_RETRY_SECONDS)


ComeBack = BrokerDelay


def for_consumer(consumer: Consumer, ledger: RunLedger) -> ComeBack:
    """The strategy this consumer's broker allows."""
    return BrokerDelay(consumer, ledger) if consumer.can_delay else OutboxRearm(consumer, ledger)
