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

import redis
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from broker import TransportUnavailable
from lifecycle import Backoff, Stop
from relay import metrics
from relay.engine import OUTAGE_BACKOFF_FIRST, OUTAGE_BACKOFF_MAX, OutboxRelay
from relay.schedules import enqueue_due_schedules

logger = logging.getLogger("hubdommed.relay")

# Schedules are looked at no more often than this (seconds); their periods are hours.
SCHEDULE_CHECK_INTERVAL = 1.0
# Longest single BLPOP (seconds): how long SIGTERM may wait while the relay is idle.
BLPOP_SLICE = 1.0


class Command(BaseCommand):
    help = "Deliver committed outbox rows to the broker (RabbitMQ or SQS) as they become due."

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop = Stop()
        self._relay: OutboxRelay | None = None
        self._redis: redis.Redis | None = None
        self._redis_down = False
        self._schedules_checked_at = float("-inf")
        # Consecutive passes the database failed, and the pause they call for.
        self._database = Backoff(OUTAGE_BACKOFF_FIRST, OUTAGE_BACKOFF_MAX)

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="drain what is due once, then exit")

    @property
    def shutdown(self) -> bool:
        return self.stop.requested

    @property
    def database_outages(self) -> int:
        return self._database.failures

    @property
    def relay(self) -> OutboxRelay:
        if self._relay is None:
            self._relay = OutboxRelay()
        return self._relay

    # -- step methods (tested directly) --------------------------------------------------------

    def relay_one_batch(self) -> bool:
        """One pass over the outbox; True when more is due right away."""
        return self.relay.relay_one_batch()

    def enqueue_due_schedules(self) -> list[str]:
        self._schedules_checked_at = time.monotonic()
        enqueued = enqueue_due_schedules()
        if enqueued:
            logger.info("relay enqueued scheduled tasks: %s", ", ".join(enqueued))
        return enqueued

    def drain(self) -> None:
        """Batches until nothing is due (or the broker is unreachable, or we are asked to
        stop), more than one in flight where the transport allows it."""
        # A connection the database dropped while the relay was idle (a restart, a
        # terminated backend) is replaced here, not found dead by the first statement:
        # with CONN_HEALTH_CHECKS, the first query after this checks it. Not inside a
        # caller's transaction (a test, a shell): that connection is the caller's.
        if not connection.in_atomic_block:
            close_old_connections()
        if time.monotonic() - self._schedules_checked_at >= SCHEDULE_CHECK_INTERVAL:
            self.enqueue_due_schedules()
        self.relay.drain(stop=lambda: self.shutdown)

    def wait_for_signal(self, timeout: float | None = None) -> None:
        """Block until the wake signal or ``timeout`` (the sweep interval), whichever comes
        first; SIGTERM ends the wait within a slice."""
        timeout = settings.RELAY_SWEEP_INTERVAL if timeout is None else timeout
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
            self.stop.wait(timeout)
            metrics.WAKES.labels(source="sweep").inc()
            return
        if source is not None:
            metrics.WAKES.labels(source=source).inc()
        if self._redis_down:
            logger.info("Redis reachable again: waking on the outbox signal")
            self._redis_down = False

    @property
    def redis(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
                # BLPOP holds the socket for up to a slice.
                socket_timeout=BLPOP_SLICE + 5,
            )
        return self._redis

    # -- the loop ------------------------------------------------------------------------------

    def handle(self, *args, once: bool = False, **options) -> str:
        if not settings.RELAY_ENABLED:
            raise CommandError(
                "The relay is disabled here. Exactly one service per environment runs it: "
                "set HUBDOMMED_RELAY=true in that service's environment."
            )
        logger.info(
            "relay starting: broker=%s batch=%d sweep=%gs wake key=%s",
            settings.BROKER,
            self.relay.batch_size,
            settings.RELAY_SWEEP_INTERVAL,
            settings.OUTBOX_WAKE_KEY,
        )
        try:
            self.relay.transport.setup_topology()
        except TransportUnavailable as exc:
            logger.warning("broker unreachable at start (%s); will keep trying", exc)
        try:
            if once:
                self.drain()
            else:
                self.run_forever()
        finally:
            self.relay.close()
            if self._redis is not None:
                self._redis.close()
        return f"relay stopped: {self.relay.sent} messages sent in {self.relay.batches} batches"

    def run_forever(self) -> None:
        self.stop.install()
        while not self.shutdown:
            self.relay.heartbeat.beat()
            try:
                self.drain()
            except (OperationalError, InterfaceError) as exc:
                self._database_failed(exc)
                self.wait_for_signal(self.database_backoff)
                continue
            except Exception:
                # A bug: say so, wait, carry on (with a fresh database connection).
                logger.exception("relay pass failed; retrying after the sweep interval")
                self._drop_connection()
                self.wait_for_signal()
                continue
            if self.database_outages:
                logger.info(
                    "database reachable again after %d failed passes", self.database_outages
                )
                self._database.reset()
            if self.shutdown:
                break
            # While the broker is away: retry after a short backoff, or as soon as a commit
            # signals new rows (either may find it back).
            self.wait_for_signal(self.relay.outage_backoff if self.relay.outages else None)

    @property
    def database_backoff(self) -> float:
        return self._database.pause

    def _database_failed(self, exc: Exception) -> None:
        """The database went away (or dropped this connection): one line, no traceback:
        an outage is expected, and the next pass reconnects."""
        self._database.failed()
        self._drop_connection()
        logger.warning(
            "database unreachable (%s); retrying in %.1f s",
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            self.database_backoff,
        )

    @staticmethod
    def _drop_connection() -> None:
        try:
            connection.close()
        except Exception:  # already broken: nothing left to save
            logger.debug("closing the database connection failed", exc_info=True)
