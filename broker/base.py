"""The one small interface every broker transport implements.

The relay hands a transport a batch of messages and learns, per message, whether the
broker took responsibility for it (``sent``), refused that one message (``rejected``:
the others are fine, so only that row backs off), or could not be asked at all
(``unconfirmed``: the broker is unreachable or the connection dropped before it
answered). A transport never raises for a broker outage while sending: it reports it,
so whatever the broker did confirm is still marked sent.

The consume side (receive, ack, return with a delay, dead-letter, extend visibility)
belongs in the same modules: connections and topology here are not publisher-specific.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


class TransportUnavailable(Exception):
    """The broker cannot be reached or stopped answering."""


@dataclass(frozen=True)
class OutgoingMessage:
    """One outbox row, ready for the wire. ``key`` identifies it in the result."""

    key: int
    run_id: str
    destination: str
    task: str
    body: bytes
    correlation_id: str = ""
    event: str | None = None
    # The row's tenant, for the relay's log lines (not sent: the envelope carries it).
    tenant_id: str | None = None
    # The envelope's W3C traceparent, for the relay's span (not sent: the envelope has it).
    traceparent: str | None = None
    # Seconds the row had been due when it was claimed, for the relay's batch line.
    waited: float = 0.0


@dataclass
class SendResult:
    sent: list[int] = field(default_factory=list)
    rejected: dict[int, str] = field(default_factory=dict)
    unconfirmed: list[int] = field(default_factory=list)
    # Why ``unconfirmed`` is not empty: the outage, in one line.
    error: str | None = None


class PendingSend:
    """A batch handed to the transport whose answers may not all be in yet."""

    def __init__(self, result: SendResult) -> None:
        self._result = result

    def result(self) -> SendResult:
        """The broker's answer to each message (waits for it)."""
        return self._result


class Transport(ABC):
    name: str
    # Batches ``begin`` can have in flight at once (1: ``begin`` waits for the answers).
    max_in_flight = 1
    # Called about once a second while the broker holds publishing back (RabbitMQ's
    # connection.blocked): a wait that is flow control, not a hang, keeps the caller's
    # sign of life fresh (the relay's heartbeat).
    on_held: Callable[[], None] | None = None

    @abstractmethod
    def setup_topology(self) -> None:
        """Declare the exchange, the queue classes and their dead-letter queues (idempotent)."""

    @abstractmethod
    def ensure_destination(self, destination: str) -> None:
        """Make sure a destination's queue and its dead-letter queue exist (idempotent,
        remembered for the life of the transport)."""

    @abstractmethod
    def send(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        """Publish and wait for the broker's answer to each message."""

    def begin(self, messages: Sequence[OutgoingMessage]) -> PendingSend:
        """Start publishing; the answers come with ``result()`` of what it returns. The
        default publishes and waits at once."""
        return PendingSend(self.send(messages))

    @abstractmethod
    def close(self) -> None:
        """Drop the connection; the next call reconnects."""
