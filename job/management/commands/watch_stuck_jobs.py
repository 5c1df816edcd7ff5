"""``manage.py watch_stuck_jobs``: rescue the jobs that got stuck, every 30 s.

Each cycle, in steps that each fail alone (logged, and the next step and the next
cycle run anyway):

0. after an outage (the previous cycle ended more than the interval plus a margin ago:
   the monitor, and most likely the hub, was down), give every running job a whole
   fresh lease: its worker could not heartbeat to a hub that was not there;
   and power their machines on again (a worker that stopped with the hub reports the
   outcome it kept on disk);
1. power on again the machines of automations whose jobs have waited pending longer
   than ``MONITOR_PENDING_SECONDS``: one ``machines.power_on`` per automation; and
   restart (``machines.restart``) the machines whose worker has not been heard from for
   ``MONITOR_WORKER_SILENT_SECONDS`` while jobs wait that long (crashed, hung, or
   holding a rotated-out credential);
2. settle the running jobs whose lease expired (their worker stopped heartbeating):
   ``worker_lost``, or back to pending when the automation allows another attempt;
3. stop the ``ec2`` machines idle for longer than ``MONITOR_EC2_IDLE_SECONDS``.

One line of counts per cycle at info. SIGTERM or SIGINT end the loop within a second
(the wait between cycles is cut in slices) and the process exits 0. Two monitors
running at once never settle a job twice (SKIP LOCKED, and the lease re-checked under
the lock); they may each re-send a power-on, which is idempotent.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, close_old_connections, connection
from django.utils import timezone

from automation.machines.services import machines_stop_idle
from common.context import log_context
from common.metrics import Heartbeat, serve_metrics
from job.monitor_metrics import MONITOR_CYCLES, MONITOR_JOBS, MONITOR_STEP_ERRORS
from job.selectors import automation_ids_with_work, jobs_with_expired_lease
from job.services import (
    Settlement,
    job_settle_lost,
    jobs_renew_leases_after_outage,
    jobs_resend_power_on,
    jobs_restart_silent_workers,
    monitor_cycle_ended,
)
from lifecycle import Stop

logger = logging.getLogger("hubdommed.monitor")

# From the end of one cycle to the start of the next is at most the interval (less when a
# cycle is slow); longer than the interval plus this, and the monitor was not running.
OUTAGE_MARGIN_SECONDS = 5.0


@dataclass
class CycleCounts:
    leases_renewed: int = 0
    powered_on: int = 0
    workers_restarted: int = 0
    settled: Counter = field(default_factory=Counter)
    machines_stopped: int = 0
    errors: int = 0

    def line(self) -> str:
        return (
            f"monitor cycle: power-on re-sent for {self.powered_on} automations; "
            f"{self.workers_restarted} silent workers restarted; "
            f"lost workers: {self.settled[Settlement.FAILED]} failed, "
            f"{self.settled[Settlement.REQUEUED]} requeued, "
            f"{self.settled[Settlement.CANCELED]} canceled, "
            f"{self.settled[Settlement.ALIVE]} alive after all, "
            f"{self.settled['error']} errors; "
            f"{self.machines_stopped} idle machines stopped; {self.errors} step errors"
            + (
                f"; {self.leases_renewed} leases renewed after an outage"
                if self.leases_renewed
                else ""
            )
        )

    def count(self) -> None:
        """Adds this cycle to the monitor's metrics (``job.monitor_metrics``)."""
        MONITOR_CYCLES.inc()
        for action, value in (
            ("lease_renewed", self.leases_renewed),
            ("power_on_resent", self.powered_on),
            ("worker_restarted", self.workers_restarted),
            ("lost_failed", self.settled[Settlement.FAILED]),
            ("lost_requeued", self.settled[Settlement.REQUEUED]),
            ("lost_canceled", self.settled[Settlement.CANCELED]),
            ("lost_alive", self.settled[Settlement.ALIVE]),
            ("lost_error", self.settled["error"]),
            ("machine_stopped", self.machines_stopped),
        ):
            # inc(0) too: every action's series exists from the first cycle on, so a
            # rate() over it is 0 rather than absent.
            MONITOR_JOBS.labels(action=action).inc(value)


class Command(BaseCommand):
    help = (
        "Rescue stuck jobs: power machines on again for long-pending jobs, settle running "
        "jobs whose worker was lost, stop idle ec2 machines."
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.stop = Stop()
        self.cycles = 0
        self.interval = settings.MONITOR_INTERVAL_SECONDS
        self.heartbeat = Heartbeat("monitor", settings.LIVENESS_FILE)

    def add_arguments(self, parser):
        parser.add_argument("--once", action="store_true", help="run one cycle, then exit")
        parser.add_argument(
            "--interval",
            type=float,
            default=None,
            help="seconds between cycles (default: MONITOR_INTERVAL_SECONDS, 30)",
        )

    @property
    def shutdown(self) -> bool:
        return self.stop.requested

    # -- step methods (tested directly) --------------------------------------------------------

    def renew_leases_after_outage(self) -> int:
        """Step 0: a whole fresh lease for running jobs when the hub was down."""
        return jobs_renew_leases_after_outage(interval=self.interval, margin=OUTAGE_MARGIN_SECONDS)

    def power_on_for_pending(self) -> int:
        """Step 1: one power-on per automation with a job pending too long."""
        cutoff = timezone.now() - timedelta(seconds=settings.MONITOR_PENDING_SECONDS)
        return len(jobs_resend_power_on(pending_before=cutoff))

    def restart_silent_workers(self) -> int:
        """Step 1b: one restart per automation whose worker is silent while jobs wait."""
        cutoff = timezone.now() - timedelta(seconds=settings.MONITOR_WORKER_SILENT_SECONDS)
        return len(jobs_restart_silent_workers(silent_since=cutoff))

    def settle_lost_jobs(self) -> Counter:
        """Step 2: each running job whose lease expired, in its own transaction."""
        settled: Counter = Counter()
        for job_id in jobs_with_expired_lease(now=timezone.now()):
            if self.shutdown:
                break
            try:
                settled[job_settle_lost(job_id=job_id)] += 1
            except (OperationalError, InterfaceError):
                raise  # the database is away: the step fails once, not once per job
            except Exception:
                # One job that cannot be settled must not keep the others (listed after
                # it, every cycle) from being settled.
                logger.exception("monitor could not settle job %s", job_id)
                settled["error"] += 1
        return settled

    def stop_idle_machines(self) -> int:
        """Step 3: the ec2 machines with no work, not seen for the idle time."""
        return machines_stop_idle(
            idle_for=timedelta(seconds=settings.MONITOR_EC2_IDLE_SECONDS),
            busy_automation_ids=automation_ids_with_work(),
        )

    def run_cycle(self) -> CycleCounts:
        # What a cycle causes (power-ons, settled jobs' events) and what it logs share an id
        # of the cycle's own, never one the process would keep from its first cycle on.
        with log_context(correlation_id=str(uuid.uuid4())):
            return self._run_cycle()

    def _run_cycle(self) -> CycleCounts:
        counts = CycleCounts()
        for step, keep in (
            (self.renew_leases_after_outage, "leases_renewed"),
            (self.power_on_for_pending, "powered_on"),
            (self.restart_silent_workers, "workers_restarted"),
            (self.settle_lost_jobs, "settled"),
            (self.stop_idle_machines, "machines_stopped"),
        ):
            # A connection the database dropped (a restart, a terminated backend, an idle
            # timeout) is replaced before each step, not found dead by it. Not inside a
            # caller's transaction (a test, a shell): that connection is the caller's.
            if not connection.in_atomic_block:
                close_old_connections()
            try:
                setattr(counts, keep, step())
            except (OperationalError, InterfaceError) as exc:
                # The database is away: one line, no traceback; the next step (or cycle)
                # starts on a new connection.
                logger.warning("monitor step %s: database unreachable (%s)", step.__name__, exc)
                connection.close()
                counts.errors += 1
                MONITOR_STEP_ERRORS.labels(step=step.__name__).inc()
            except Exception:
                # AWS away, or a bug: the other steps still run.
                logger.exception("monitor step %s failed", step.__name__)
                counts.errors += 1
                MONITOR_STEP_ERRORS.labels(step=step.__name__).inc()
        try:
            monitor_cycle_ended()
        except Exception:
            logger.exception("monitor could not record the end of its cycle")
            counts.errors += 1
            MONITOR_STEP_ERRORS.labels(step="monitor_cycle_ended").inc()
        self.cycles += 1
        counts.count()
        logger.info(counts.line())
        # Alive: a cycle went round, whatever its steps met (an outage is not a hang).
        self.heartbeat.beat()
        return counts

    # -- the loop ------------------------------------------------------------------------------

    def handle(self, *args, once: bool = False, interval: float | None = None, **options) -> str:
        interval = settings.MONITOR_INTERVAL_SECONDS if interval is None else interval
        if interval <= 0:
            raise CommandError("--interval must be a positive number of seconds")
        self.interval = interval
        serve_metrics(settings.METRICS_PORT)
        logger.info(
            "monitor starting: every %gs; pending after %ss; ec2 idle after %ss",
            interval,
            settings.MONITOR_PENDING_SECONDS,
            settings.MONITOR_EC2_IDLE_SECONDS,
        )
        if once:
            self.run_cycle()
        else:
            self.run_forever(interval)
        return f"monitor stopped after {self.cycles} cycles"

    def run_forever(self, interval: float) -> None:
        self.stop.install()
        while not self.shutdown:
            started = time.monotonic()
            # A connection the database dropped (a restart, an idle timeout) or one past
            # DB_CONN_MAX_AGE is replaced here, as a request would at its start.
            close_old_connections()
            self.run_cycle()
            self.sleep_until(started + interval)

    def sleep_until(self, deadline: float) -> None:
        # Woken by a stop: it never waits a whole interval.
        self.stop.sleep_until(deadline)
