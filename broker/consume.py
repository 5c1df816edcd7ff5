"""The consume side of a broker transport: what a worker does with a received message.

A ``Consumer`` hands out ``Delivery`` objects and settles each exactly once, in one of
four ways:

- ``ack``: done, never deliver it again (``ack_many``: several at once, in as few
  broker calls as the transport allows);
- ``release``: give it back now, untouched (a worker shutting down);
- ``retry_later``: give it back after a delay (a transient failure); only a transport
  with ``can_delay`` honours the delay (SQS, through the message's visibility); RabbitMQ
  has no delay of its own that we use (the design keeps delays in the outbox's
  ``available_at``), so there it returns the message at once and the layer above is
  expected to re-arm the outbox row instead (see docs/worker.md);
- ``dead_letter`` then ``ack``: park a copy in its queue's dead-letter queue with the
  error's context, then (once the caller has recorded the failure) drop the original.

While a message is being worked on, ``extend`` keeps it from being delivered elsewhere
(SQS: ``ChangeMessageVisibility``; RabbitMQ: nothing to do, the message stays unacked
while the connection's heartbeats flow).

Settling methods may be called from any thread. Nothing here touches the database, so
a worker that has none (an automation's own worker) runs on the same layer.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.conf import settings

from broker import topology
from broker.base import TransportUnavailable

# How much of a traceback travels with a dead-lettered message.
TRACEBACK_EXCERPT_CHARS = 2000
ERROR_MESSAGE_CHARS = 1000


class BadMessage(ValueError):
    """A message that is not a JSON object: no retry can fix it."""


@dataclass(eq=False)
class Delivery:
    """One received message, with what the transport needs to settle it."""

    destination: str
    body: bytes
    # Transport-specific handle: a delivery tag (RabbitMQ) or receipt handle (SQS).
    receipt: Any
    # How many times the broker has delivered it, this one included (best effort: SQS's
    # ApproximateReceiveCount, RabbitMQ's x-delivery-count + 1).
    broker_receive_count: int = 1
    message_id: str | None = None
    properties: Any = None
    # The connection generation it arrived on (RabbitMQ): a tag from an older
    # connection cannot be settled any more, the broker already took the message back.
    generation: int = 0
    settled: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @cached_property
    def envelope(self) -> dict[str, Any]:
        try:
            data = json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise BadMessage(f"message body is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise BadMessage("message body is not a JSON object")
        return data

    @property
    def run_id(self) -> str | None:
        try:
            value = self.envelope.get("run_id")
        except BadMessage:
            return self.message_id
        return str(value) if value else self.message_id

    @contextmanager
    def settling(self) -> Iterator[bool]:
        """Hold the right to settle: yields True to exactly one caller, ever.

        The worker finishing a task and the shutdown giving the message back may race;
        whichever comes first settles it (and records the run's state), the other does
        nothing.
        """
        with self._lock:
            if self.settled:
                yield False
                return
            self.settled = True
            yield True

    def take_settlement(self) -> bool:
        """The right to settle, without holding it while settling: for settling many
        deliveries together (their outcomes in one commit, then one ack). True for exactly
        one caller, ever (``settling`` included)."""
        with self._lock:
            if self.settled:
                return False
            self.settled = True
            return True


@dataclass(frozen=True)
class FailureContext:
    """Why a message was dead-lettered, carried with it to the dead-letter queue."""

    error_type: str
    message: str
    traceback: str
    receive_count: int
    failed_at: str
    worker: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")

    @classmethod
    def from_exception(cls, exc: BaseException, *, receive_count: int, tb: str) -> FailureContext:
        kind = type(exc)
        return cls(
            error_type=f"{kind.__module__}.{kind.__qualname__}",
            message=str(exc)[:ERROR_MESSAGE_CHARS],
            traceback=tb[-TRACEBACK_EXCERPT_CHARS:],
            receive_count=receive_count,
            failed_at=_utc_now(),
        )

    def as_dict(self) -> dict[str, str]:
        """As message headers/attributes: ``x-error-*`` strings."""
        return {
            "x-error-type": self.error_type,
            "x-error-message": self.message,
            "x-error-traceback": self.traceback,
            "x-error-receive-count": str(self.receive_count),
            "x-error-failed-at": self.failed_at,
            "x-error-worker": self.worker,
        }


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def visibility_timeout(destination: str) -> int:
    """Seconds a message being worked on is kept from everyone else: the design's table
    (by queue class), unless ``WORKER_VISIBILITY_TIMEOUT`` overrides it. SQS hides a
    received message that long; the task runtime's run lease has the same length on
    both transports."""
    override = settings.WORKER_VISIBILITY_TIMEOUT
    if override:
        return max(1, math.ceil(override))
    return topology.VISIBILITY_TIMEOUT[topology.queue_class(destination)]


def heartbeat_interval(destination: str) -> float:
    """Seconds between two extensions of what ``visibility_timeout`` grants: a third of
    it, unless ``WORKER_HEARTBEAT_INTERVAL`` says otherwise."""
    return settings.WORKER_HEARTBEAT_INTERVAL or visibility_timeout(destination) / 3


class Consumer(ABC):
    name: str
    # Whether ``retry_later`` honours its delay (else the message comes back at once).
    can_delay: bool = False
    # Whether the messages a consumer held unsettled are delivered to others the moment it
    # dies (RabbitMQ: with its connection), rather than when their visibility ends (SQS).
    returns_unsettled_at_once: bool = False

    @abstractmethod
    def start(self, destinations: Sequence[str], prefetch: int) -> None:
        """Connect, make sure the destinations' queues exist, start receiving (at most
        ``prefetch`` unsettled messages at a time)."""

    @abstractmethod
    def poll(self, timeout: float) -> list[Delivery]:
        """Wait up to ``timeout`` seconds for deliveries. Called from one thread only (the
        one that called ``start``), often: on RabbitMQ it is also what moves the
        connection's I/O (heartbeats, settlements asked for by other threads)."""

    @abstractmethod
    def stop_fetching(self) -> None:
        """Receive nothing more; what is held stays held until settled."""

    @abstractmethod
    def ack(self, delivery: Delivery) -> None: ...

    def ack_many(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[Delivery]:
        """Ack several deliveries in as few broker calls as the transport allows; returns
        those that could not be acked (their connection is gone: the broker brings them
        back by itself). ``wait=False``: a transport that acks from another thread may
        return before the acks are sent (what fails then is only logged)."""
        failed = []
        for delivery in deliveries:
            try:
                self.ack(delivery)
            except TransportUnavailable:
                failed.append(delivery)
        return failed

    @abstractmethod
    def release(self, delivery: Delivery) -> None: ...

    @abstractmethod
    def retry_later(self, delivery: Delivery, delay: float) -> None: ...

    @abstractmethod
    def dead_letter(self, delivery: Delivery, failure: FailureContext) -> None:
        """Put a copy in the destination's dead-letter queue with ``failure`` (confirmed by
        the broker). Does not settle the delivery: the caller acks it next."""

    @abstractmethod
    def extend(self, delivery: Delivery) -> None:
        """Heartbeat: keep the message from being delivered elsewhere a while longer."""

    @abstractmethod
    def heartbeat_interval(self, delivery: Delivery) -> float | None:
        """Seconds between ``extend`` calls for this delivery; None: not needed."""

    @abstractmethod
    def close(self) -> None: ...


@dataclass(frozen=True)
class DeadLetter:
    """A message sitting in a dead-letter queue, as an operator sees it."""

    destination: str
    body: bytes
    # The x-error-* context the runtime attached ({} when the broker's redrive put it there).
    error: dict[str, str]
    message_id: str | None = None

    @property
    def run_id(self) -> str | None:
        try:
            envelope = json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return self.message_id
        value = envelope.get("run_id") if isinstance(envelope, dict) else None
        return str(value) if value else self.message_id

    @property
    def task(self) -> str:
        try:
            envelope = json.loads(self.body)
        except (UnicodeDecodeError, json.JSONDecodeError):
            return "?"
        return str(envelope.get("task", "?")) if isinstance(envelope, dict) else "?"


class DeadLetterBox(ABC):
    """Look into a destination's dead-letter queue and send messages back to their queue."""

    @abstractmethod
    def peek(self, destination: str, limit: int) -> list[DeadLetter]:
        """Up to ``limit`` messages, left where they are."""

    @abstractmethod
    def count(self, destination: str) -> int:
        """How many messages wait in the destination's dead-letter queue (the broker's
        count: on SQS an approximation, as SQS gives no other)."""

    @abstractmethod
    def requeue(
        self,
        destination: str,
        choose: Callable[[DeadLetter], bool],
        limit: int,
        before_send: Callable[[DeadLetter], None] | None = None,
    ) -> list[DeadLetter]:
        """Send the chosen messages (among the first ``limit``) back to the destination's
        queue without their error context; return them. ``before_send`` is called with each
        one just before it is sent: what a consumer receiving it at once must find is made
        ready then."""

    @abstractmethod
    def discard(
        self, destination: str, choose: Callable[[DeadLetter], bool], limit: int
    ) -> list[DeadLetter]:
        """Delete the chosen messages (among the first ``limit``) for good; return them."""

    @abstractmethod
    def close(self) -> None:
        """Release connections."""
