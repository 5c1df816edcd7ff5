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

from django.conf import settings

from common.context import log_context
from common.metrics import Heartbeat, serve_metrics
from lifecycle.daemon import Daemon
from schedule.firing import schedules_end_orphaned, schedules_fire_due
from schedule.metrics import SCHEDULER_CYCLES, SCHEDULER_ERRORS, SCHEDULER_RUNS

logger = logging.getLogger("hubdommed.scheduler")

# Batches one cycle fires at most before it checks for a stop.
MAX_BATCHES_PER_CYCLE = 100


class Command(Daemon):
    help = "Start a job for each tenant schedule whose due time has come, every few seconds."
    name = "scheduler"
    interval_setting = "SCHEDULER_INTERVAL_SECONDS"
    logger = logger
    log_context = staticmethod(log_context)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = 0
        self.heartbeat = Heartbeat("scheduler", settings.LIVENESS_FILE)

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

    # -- the cycle (lifecycle.daemon runs it) --------------------------------------------------

    def cycle(self) -> None:
        for _ in range(MAX_BATCHES_PER_CYCLE):
            if self.stop.requested or not self.fire_one_batch():
                break
        self.end_orphaned()

    def run_cycle(self) -> None:
        super().run_cycle()
        SCHEDULER_CYCLES.inc()

    def database_away(self, exc: Exception) -> None:
        super().database_away(exc)
        SCHEDULER_ERRORS.labels(cause="database").inc()

    def cycle_failed(self) -> None:
        super().cycle_failed()
        SCHEDULER_ERRORS.labels(cause="bug").inc()

    def starting(self) -> None:
        logger.info("scheduler starting: every %gs", self.interval)
        serve_metrics("scheduler")

    def summary(self) -> str:
        return f"scheduler stopped after {self.cycles} cycles: {self.started} jobs started"
