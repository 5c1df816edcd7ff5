"""``manage.py run_scheduler``: start the jobs of the tenants' schedules as they fall due.

Each cycle fires the due schedules, batch after batch, then deactivates the schedules whose
automation or tenant was deactivated. Between cycles it sleeps until the earliest next due
time, or until a change to a schedule wakes it (the Redis signal of ``schedule.wake``), and
never longer than ``SCHEDULER_INTERVAL_SECONDS``, the safety sweep: a run starts within a
moment of its due time, and with Redis away within one interval. Any number
may run at once (two for availability, or one left over from a deploy): SKIP LOCKED shares
the due schedules between them and the unique key on (schedule, due time) keeps each due
time to one job, across restarts and clock jumps.

A database that goes away costs one warning per cycle and a fresh connection for the next.
SIGTERM or SIGINT end the loop within a second and the process exits 0.
"""

from __future__ import annotations

import gc
import logging
import time
from datetime import datetime

import redis
from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from common.daemon import Daemon
from common.metrics import Heartbeat, serve_metrics
from lifecycle import conditions
from outbox.wake import wait_for_signal
from schedule.firing import ParamsChecks, next_due_at, schedules_end_orphaned, schedules_fire_due
from schedule.metrics import SCHEDULER_CYCLES, SCHEDULER_ERRORS, SCHEDULER_RUNS
from schedule.wake import scheduler_wake_key

logger = logging.getLogger("hubdommed.scheduler")

# Batches one cycle fires at most before it checks for a stop.
MAX_BATCHES_PER_CYCLE = 100
# Seconds of one wait on the wake signal: a stop is honoured within it.
WAIT_SLICE = 0.5
# The shortest pause when something is due already (held by another scheduler, or more
# than a cycle's batches): the next cycle comes soon, without spinning.
MIN_PAUSE = 0.05


class Command(Daemon):
    help = "Start a job for each tenant schedule whose due time has come, every few seconds."
    name = "scheduler"
    interval_setting = "SCHEDULER_INTERVAL_SECONDS"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.started = 0
        self.heartbeat = Heartbeat("scheduler", settings.LIVENESS_FILE)
        self._redis: redis.Redis | None = None
        self._redis_down = False
        # What ended the latest pause: "due", "signal", "sweep" or "stop" (tests read it).
        self.woken_by = ""
        # The parameters found valid (remembered while the process lives) and each cycle's
        # time for checks, in all and per tenant (``schedule.firing.ParamsChecks``).
        self.checks = ParamsChecks()

    # -- step methods (tested directly) --------------------------------------------------------

    def fire_one_batch(self) -> bool:
        """Fire one batch of due schedules; True when more may be due right away."""
        firing = schedules_fire_due(checks=self.checks)
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

    def pause_deadline(self, started: float) -> float:
        """The monotonic time to sleep until: the earliest next due time, bounded by the
        interval from ``started`` (the safety sweep)."""
        deadline = started + self.interval
        try:
            due = next_due_at()
        except (OperationalError, InterfaceError) as exc:
            self.database_away(exc)
            return deadline
        if due is not None:
            until = _seconds_until(due)
            deadline = min(deadline, time.monotonic() + max(until, MIN_PAUSE))
        return deadline

    def wait_for_wake(self, deadline: float) -> str:
        """Sleep until ``deadline`` (monotonic) or a wake signal, whichever comes first;
        a stop ends the wait within a slice. With Redis away, a plain sleep."""
        while not self.stop.requested:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "due"
            slice_ = min(remaining, WAIT_SLICE)
            try:
                woken = wait_for_signal(self._client(), scheduler_wake_key(), slice_)
            except (redis.RedisError, OSError) as exc:
                if not self._redis_down:
                    logger.warning(
                        "scheduler: Redis unreachable (%s): looking for due schedules at "
                        "their due times and every %g s until it is back",
                        exc,
                        self.interval,
                    )
                    self._redis_down = True
                conditions.degraded(
                    "redis",
                    f"unreachable ({exc}): due schedules looked for every {self.interval:g} s",
                )
                self.stop.sleep_until(min(deadline, time.monotonic() + 1.0))
                continue
            if self._redis_down:
                logger.info("scheduler: Redis is back, waking on changes again")
                self._redis_down = False
                conditions.recovered("redis")
            if woken:
                return "signal"
        return "stop"

    def _client(self) -> redis.Redis:
        if self._redis is None:
            self._redis = redis.Redis.from_url(
                settings.REDIS_URL,
                socket_connect_timeout=settings.REDIS_SOCKET_TIMEOUT,
                # A wait is a read of up to a slice.
                socket_timeout=WAIT_SLICE + settings.REDIS_SOCKET_TIMEOUT,
            )
        return self._redis

    # -- the cycle (lifecycle.daemon runs it) --------------------------------------------------

    def cycle(self) -> None:
        self.checks.new_cycle()
        for _ in range(MAX_BATCHES_PER_CYCLE):
            if self.stop.requested or not self.fire_one_batch():
                break
        self.end_orphaned()

    def run_cycle(self) -> None:
        super().run_cycle()
        SCHEDULER_CYCLES.inc()

    def pause(self, started: float) -> None:
        self.woken_by = self.wait_for_wake(self.pause_deadline(started))

    def database_away(self, exc: Exception) -> None:
        super().database_away(exc)
        SCHEDULER_ERRORS.labels(cause="database").inc()

    def cycle_failed(self) -> None:
        super().cycle_failed()
        SCHEDULER_ERRORS.labels(cause="bug").inc()

    def starting(self) -> None:
        logger.info(
            "scheduler starting: at each due time, on each change, and at least every %gs",
            self.interval,
        )
        serve_metrics("scheduler")
        # What the process loaded to start (Django, the apps, their modules) lives as long as
        # it does: out of the collector's sight, a burst's batches, which make and drop many
        # objects each, no longer pay for scanning it again and again (about a sixth of a
        # batch's CPU time).
        gc.freeze()

    def finished(self) -> None:
        if self._redis is not None:
            self._redis.close()

    def summary(self) -> str:
        return f"scheduler stopped after {self.cycles} cycles: {self.started} jobs started"


def _seconds_until(moment: datetime) -> float:
    return (moment - timezone.now()).total_seconds()
