"""The brokers' own metrics (those of the relay's batches are in ``relay.metrics``)."""

from __future__ import annotations

from prometheus_client import Gauge

PUBLISHING_BLOCKED = Gauge(
    "hubdommed_broker_publishing_blocked",
    "1 while RabbitMQ blocks this process's publishing connection (a memory or disk alarm: "
    "flow control, not an outage), else 0",
    multiprocess_mode="max",
)
