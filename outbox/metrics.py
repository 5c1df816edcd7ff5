"""The outbox backlog as Prometheus gauges, measured when scraped.

Not a module-level gauge that some loop keeps up to date: the figures are the database's,
whoever wrote the rows, so they are read at scrape time by ``OutboxBacklogCollector``. It is
registered only where it should be reported (the relay's metrics server and the API's
``/metrics``: ``common.metrics.registry(collectors=...)``), never by the workers, which would
report the same figures once per process.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from django.db import DatabaseError, connection
from prometheus_client.core import GaugeMetricFamily

from outbox.backlog import outbox_backlog

logger = logging.getLogger("hubdommed.metrics")


class OutboxBacklogCollector:
    """``hubdommed_outbox_pending_messages{table}`` and
    ``hubdommed_outbox_oldest_due_age_seconds{table}``.

    While the database is away the samples are left out of the scrape (an absent series
    is what alerts on ``absent()`` or on the relay's heartbeat notice), and the failure is
    logged once, not on every scrape, until a scrape succeeds again.

    ``close_connection``: close this thread's database connection after each scrape. The
    daemons' metrics server answers each scrape in a new thread, whose connection nothing
    else would ever close; the API's view leaves it to the request's end.
    """

    def __init__(self, *, close_connection: bool = False) -> None:
        self.close_connection = close_connection
        self.failing = False

    def describe(self) -> list[GaugeMetricFamily]:
        # The families without samples: describing must not query the database.
        return list(self._families())

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        pending = GaugeMetricFamily(
            "hubdommed_outbox_pending_messages",
            "Outbox rows not sent to the broker yet (due or not).",
            labels=["table"],
        )
        oldest = GaugeMetricFamily(
            "hubdommed_outbox_oldest_due_age_seconds",
            "Seconds since the oldest due, unsent outbox row became due (0 when none is).",
            labels=["table"],
        )
        return pending, oldest

    def collect(self) -> Iterator[GaugeMetricFamily]:
        try:
            backlogs = outbox_backlog()
        except DatabaseError as exc:
            if not self.failing:
                logger.warning("outbox backlog not measured: database unavailable (%s)", exc)
                self.failing = True
            self._drop_connection(broken=True)
            return
        finally:
            if self.close_connection:
                self._drop_connection()
        if self.failing:
            logger.info("outbox backlog measured again: the database is back")
            self.failing = False
        pending, oldest = self._families()
        for backlog in backlogs:
            pending.add_metric([backlog.table], backlog.pending)
            oldest.add_metric([backlog.table], backlog.oldest_due_age_seconds)
        yield pending
        yield oldest

    def _drop_connection(self, *, broken: bool = False) -> None:
        if not (broken or self.close_connection) or connection.in_atomic_block:
            return
        try:
            connection.close()
        except DatabaseError:  # already broken: nothing left to save
            logger.debug("closing the database connection failed", exc_info=True)
