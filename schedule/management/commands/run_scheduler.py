"""``manage.py run_scheduler``: start the jobs of the tenants' schedules as they fall due.

Every few seconds (``SCHEDULER_INTERVAL_SECONDS``) it fires the due schedules, batch after
batch, then deactivates the schedules whose automation or tenant was deactivated. Any number
may run at once (two for availability, or one left over from a deploy): SKIP LOCKED shares
the due schedules between them and the unique key on (schedule, due time) keeps each due
time to one job, across restarts and clock jumps.

A database that goes away costs one warning per cycle and a fresh connection for the next.
SIGTERM or SIGINT end the loop within a second and the process exits 0.
"""

from __future__ import annotations

import logging
import time
import uuid

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from common.context import log_context
from common.metrics import Heartbeat, serve_metrics
from lifecycle import Stop
from schedule.firing import schedules_end_orphaned, schedules_fire_due
from schedule.metrics import SCHEDULER_CYCLES, SCHEDULER_ERRORS, SCHEDULER_RUNS

logger = logging.getLogger("hubdommed.scheduler")

# Batches one cycle fires at most before it checks for a stop.
MAX_BATCHES_PER_CYCLE = 100


class Command(BaseCommand):
    help = "Start a job for each tenant schedule whose due time has come, every few seconds."

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop = Stop()
        self.cycles = 0
        self.started = 0
        self.heartbeat = Heartbeat("scheduler", settings.LIVENESS_FILE)

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one cycle, then exit")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="seconds between cycles (default: SCHEDULER_INTERVAL_SECONDS, 5)",
        )

    # -- step methods (tested directly) --------------------------------------------------------

    def fire_one_batch(self) -> bool:
        """Fire one batch of due schedules; True when more may be due right away."""
        firing = schedules_fire_due()
        self.started += len(firing.started)
        SCHEDULER_RUNS.labels(outcome="started").inc(len(firing.started))
        SCHEDULER_RUNS.labels(outcome="stopped").inc(len(firing.stopped))
        if firing.failed:
            SCHEDULER_ERRORS.labels(cause="bug").inc(len(firing.failed))
        if firing.started or firing.stopped:
            logger.info(
                "scheduler: %d jobs started, %d schedules stopped",
                len(firing.started),
                len(firing.stopped),
            )
        return firing.more

    def end_orphaned(self) -> int:
        ended = schedules_end_orphaned()
        if ended:
            logger.info("scheduler: %d schedules ended with their automation or tenant", len(ended))
            SCHEDULER_RUNS.labels(outcome="stopped").inc(len(ended))
        return len(ended)

    def run_cycle(self) -> None:
        # A connection the database dropped is replaced before the cycle, not found dead by
        # it. Not inside a caller's transaction (a test): that connection is the caller's.
        if not connection.in_atomic_block:
            close_old_connections()
        # Each cycle's lines and the jobs it starts carry an id of their own.
        with log_context(correlation_id=str(uuid.uuid4())):
            try:
                for _ in range(MAX_BATCHES_PER_CYCLE):
                    if self.stop.requested or not self.fire_one_batch():
                        break
                self.end_orphaned()
            except (OperationalError, InterfaceError) as exc:
                logger.warning("scheduler: database unreachable (%s)", exc)
                SCHEDULER_ERRORS.labels(cause="database").inc()
                connection.close()
            except Exception:
                # A bug: logged, and the next cycle tries again.
                logger.exception("scheduler cycle failed")
                SCHEDULER_ERRORS.labels(cause="bug").inc()
        self.cycles += 1
        SCHEDULER_CYCLES.inc()
        self.heartbeat.beat()

    # -- the loop ------------------------------------------------------------------------------

    def handle(self, *args, once: bool = False, interval: float | None = None, **options) -> str:
        interval = settings.SCHEDULER_INTERVAL_SECONDS if interval is None else interval
        if interval <= 0:
            raise CommandError("--interval must be a positive number of seconds")
        logger.info("scheduler starting: every %gs", interval)
        serve_metrics(settings.METRICS_PORT)
        if once:
            self.run_cycle()
        else:
            self.stop.install()
            while not self.stop.requested:
                started = time.monotonic()
                self.run_cycle()
                self.stop.sleep_until(started + interval)
        return f"scheduler stopped after {self.cycles} cycles: {self.started} jobs started"
