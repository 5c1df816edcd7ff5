"""The relay's metrics (``hubdommed_relay_*``), labelled by outbox table or wake source."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

BATCHES = Counter(
    "hubdommed_relay_batches_total",
    "Batches of due outbox rows the relay claimed and sent.",
    ["table"],
)
MESSAGES_SENT = Counter(
    "hubdommed_relay_messages_sent_total",
    "Outbox rows the broker confirmed (marked sent).",
    ["table"],
)
MESSAGES_REFUSED = Counter(
    "hubdommed_relay_messages_refused_total",
    "Outbox rows the broker refused one by one (nack, return, unroutable); they back off.",
    ["table"],
)
MESSAGES_UNCONFIRMED = Counter(
    "hubdommed_relay_messages_unconfirmed_total",
    "Outbox rows the broker did not confirm in time (unreachable); they stay due.",
    ["table"],
)
BATCH_DURATION = Histogram(
    "hubdommed_relay_batch_duration_seconds",
    "From a batch's claim to the commit of what the broker answered.",
    ["table"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)
WAKES = Counter(
    "hubdommed_relay_wakes_total",
    "Times the idle relay woke up to look at the outbox: on the signal, or by its sweep.",
    ["source"],
)
