"""``manage.py run_relay``: deliver the outbox to the broker, for as long as it runs.

Waits on ``BLPOP`` of the wake key (pushed after each commit that wrote the outbox)
with a timeout of the sweep interval; on either it runs passes until nothing is due.
Redis being down only slows it to the sweep. SIGTERM or SIGINT finish the current
batch and exit 0.

It outlives any outage of what it depends on, whatever it was doing: each pass starts by
dropping a database connection that went bad (a restart, a terminated backend), and a
database error drops it at once; the broker's transport reconnects and declares its
topology again by itself. While PostgreSQL or the broker is away the relay retries every
few seconds at most (``OUTAGE_BACKOFF_MAX``), and the wait between retries still wakes on
the outbox signal and on SIGTERM, so a dependency's return is noticed within seconds
whatever the length of the outage. One relay service per environment (``HUBDOMMED_RELAY=true``); two
running anyway never send a row twice (SKIP LOCKED).
"""

from __future__ import annotations

import logging
import time
import uuid

import redis
from django.conf import settings
from django.core.management.base import CommandError

from broker import TransportUnavailable
from common.context import log_context
from common.daemon import Daemon
from common.metrics import Heartbeat, serve_metrics
from lifecycle import Backoff, conditions
from lifecycle.failures import aborted_by
from outbox.metrics import OutboxBacklogCollector
from relay import metrics
from relay.engine import OUTAGE_BACKOFF_FIRST, OUTAGE_BACKOFF_MAX, OutboxRelay
from relay.schedules import enqueue_due_schedules

logger = logging.getLogger("hubdommed.relay")

# Schedules are looked at no more often than this (seconds); their periods are hours.
SCHEDULE_CHECK_INTERVAL = 1.0
# Longest single BLPOP (seconds): how long SIGTERM may wait while the relay is idle.
BLPOP_SLICE = 1.0
# How long after a slice's end a silent Redis counts as hung (seconds).
BLPOP_MARGIN = 0.5


class Command(Daemon):
    help = "Deliver committed outbox rows to the broker (RabbitMQ or SQS) as they become due."
    name = "relay"
    # The sweep: the longest wait between two passes when no commit wakes the relay.
    interval_setting = "RELAY_SWEEP_INTERVAL"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._relay: OutboxRelay | None = None
        self._redis: redis.Redis | None = None
        self._redis_down = False
        self._schedules_checked_at = float("-inf")
        # Consecutive passes the database failed, and the pause they call for.
        self._database = Backoff(OUTAGE_BACKOFF_FIRST, OUTAGE_BACKOFF_MAX)

    @property
    def database_outages(self) -> int:
        return self._database.failures

    @property
    def relay(self) -> OutboxRelay:
        if self._relay is None:
            self._relay = OutboxRelay()
        return self._relay

    @property
    def heartbeat(self) -> Heartbeat:
        # The engine's own: it beats after each batch too, so a long drain is not a hang.
        return self.relay.heartbeat

    # -- step methods (tested directly) --------------------------------------------------------

    def relay_one_batch(self) -> bool:
        """One pass over the outbox; True when more is due right away."""
        return self.relay.relay_one_batch()

    def enqueue_due_schedules(self) -> list[str]:
        self._schedules_checked_at = time.monotonic()
        # The runs a check enqueues share an id of their own, not one the process keeps.
        with log_context(correlation_id=str(uuid.uuid4())):
            enqueued = enqueue_due_schedules()
            if enqueued:
                logger.info("relay enqueued scheduled tasks: %s", ", ".join(enqueued))
        return enqueued

    def drain(self) -> None:
        """Batches until nothing is due (or the broker is unreachable, or we are asked to
        stop), more than one in flight where the transport allows it."""
        # With CONN_HEALTH_CHECKS, the first query after the guard checks the connection.
        self.guard_connection()
        if time.monotonic() - self._schedules_checked_at >= SCHEDULE_CHECK_INTERVAL:
            self.enqueue_due_schedules()
        self.relay.drain(stop=lambda: self.shutdown)

    def wait_for_signal(self, timeout: float | None = None) -> None:
        """Block until the wake signal or ``timeout`` (the sweep interval), whichever comes
        first; SIGTERM ends the wait within a slice."""
        timeout = self.interval if timeout is None else timeout
        deadline = time.monotonic() + timeout
        source = None
        try:
            # In slices, so that SIGTERM never waits a whole (possibly long) sweep interval.
            while not self.shutdown:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    source = "sweep"
                    break
                slice_ = min(remaining, BLPOP_SLICE)
                if self.redis.blpop([settings.OUTBOX_WAKE_KEY], timeout=slice_) is not None:
                    source = "signal"
                    break
        except (redis.RedisError, OSError) as exc:
            if not self._redis_down:
                logger.warning(
                    "Redis unreachable (%s): sweeping the outbox every %g s until it is back",
                    exc,
                    timeout,
                )
                self._redis_down = True
            conditions.degraded(
                "redis", f"unreachable ({exc}): sweeping the outbox every {timeout:g} s"
            )
            # What is left of the sweep interval: a Redis that hangs (each BLPOP waiting out
            # its socket timeout) does not stretch the sweep.
            self.stop.wait(max(deadline - time.monotonic(), 0))
            metrics.WAKES.labels(source="sweep").inc()
            return
        if source is not None:
            metrics.WAKES.labels(source=source).inc()
        if self._redis_down:
            logger.info("Redis reachable again: waking on the outbox signal")
            self._redis_down = False
            conditions.recovered("redis")

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
                # BLPOP holds the socket for up to a slice; a server that has not answered
                # a little after it is hung, and the wait falls back to the sweep.
                socket_timeout=BLPOP_SLICE + BLPOP_MARGIN,
            )
        return self._redis

    # -- the cycle (lifecycle.daemon runs it) --------------------------------------------------

    def cycle(self) -> None:
        self.drain()
        if self.database_outages:
            logger.info("database reachable again after %d failed passes", self.database_outages)
            self._database.reset()

    def run_once(self) -> None:
        # One drain, its errors the command's own: an operator running it by hand sees them.
        self.drain()

    def database_away(self, exc: Exception) -> None:
        """The database went away (or dropped this connection): one line, no traceback:
        an outage is expected, and the next pass reconnects. A transaction another ended
        (a deadlock, a lock timeout) is no outage: said as what it is, no backoff."""
        if aborted_by(exc) is not None:
            super().database_away(exc)
            return
        self._database.failed()
        self.drop_connection()
        logger.warning(
            "database unreachable (%s); retrying in %.1f s",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            self.database_backoff,
        )

    def cycle_failed(self) -> None:
        # A bug: say so, wait, carry on (with a fresh database connection).
        logger.exception("relay pass failed; retrying after the sweep interval")
        self.drop_connection()

    def pause(self, started: float) -> None:
        """Until a commit's signal or the sweep; while the database or the broker is away,
        a short backoff instead (either may be back by then)."""
        if self.database_outages:
            self.wait_for_signal(self.database_backoff)
        elif self.relay.outages:
            self.wait_for_signal(self.relay.outage_backoff)
        else:
            self.wait_for_signal()

    def starting(self) -> None:
        if not settings.RELAY_ENABLED:
            raise CommandError(
                "The relay is disabled here. Exactly one service per environment runs it: "
                "set HUBDOMMED_RELAY=true in that service's environment."
            )
        # The outbox backlog is reported here, by the one relay of the environment.
        serve_metrics("relay", collectors=[OutboxBacklogCollector(close_connection=True)])
        logger.info(
            "relay starting: broker=%s batch=%d sweep=%gs wake key=%s",
            settings.BROKER,
            self.relay.batch_size,
            self.interval,
            settings.OUTBOX_WAKE_KEY,
        )
        try:
            self.relay.transport.setup_topology()
        except TransportUnavailable as exc:
            logger.warning("broker unreachable at start (%s); will keep trying", exc)

    def finished(self) -> None:
        self.relay.close()
        if self._redis is not None:
            self._redis.close()

    def summary(self) -> str:
        return f"relay stopped: {self.relay.sent} messages sent in {self.relay.batches} batches"

    @property
    def database_backoff(self) -> float:
        return self._database.pause
