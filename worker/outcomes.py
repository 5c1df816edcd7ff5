"""What became of a task message: the outcomes the processor reports, as values, not strings.

``Outcome`` says what happened to the run; ``Settling`` says how its delivery ended when
that was not the plain way (the broker away, or the bookkeeping). The processor's
``outcomes`` counter (the worker's summary line, the tests) is keyed by ``Outcome.key``:
``succeeded``, or ``succeeded-unsettled`` when the ack could not reach the broker.
"""

from __future__ import annotations

from enum import StrEnum


class Settling(StrEnum):
    """How a delivery's settling went wrong."""

    # The broker could not be told (connection gone): it brings the message back itself.
    UNSETTLED = "unsettled"
    # The run's bookkeeping failed (the database is away): the message was given back.
    INFRASTRUCTURE = "infrastructure"


class Outcome(StrEnum):
    # The handler returned; the run is ``succeeded``.
    SUCCEEDED = "succeeded"
    # A transient failure; the message comes back after a backoff, the run ``retrying``.
    RETRYING = "retrying"
    # A permanent failure, or the last receive: dead-lettered, the run ``failed``.
    FAILED = "failed"
    # Delivered again after its run had finished: acked, not run.
    DUPLICATE = "duplicate"
    # Another worker holds the run under a live lease: back when that lease would end.
    BUSY = "busy"
    # On its last delivery before the broker's redrive: replaced by a fresh copy (its
    # outbox row), not held.
    RENEWED = "renewed"
    # Not a task message at all: dead-lettered as it is.
    UNREADABLE = "unreadable"
    # The bookkeeping before the handler failed: back for later, not counted as a failure.
    INFRASTRUCTURE = "infrastructure"

    @property
    def metric(self) -> str | None:
        """The outcome ``hubdommed_task_runs_total`` counts it as; None: not a task run."""
        return _METRIC.get(self)

    def key(self, settling: Settling | None = None) -> str:
        """Its key in the processor's counter."""
        return self.value if settling is None else f"{self.value}-{settling.value}"


_METRIC = {
    Outcome.SUCCEEDED: "succeeded",
    Outcome.RETRYING: "retried",
    Outcome.FAILED: "failed",
    Outcome.DUPLICATE: "duplicate",
}
