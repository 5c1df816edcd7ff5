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
3. stop the ``ec2`` machines idle for longer than ``MONITOR_EC2_IDLE_SECONDS``;
4. run every check of ``common.ways_forward`` (one per state machine: jobs, task runs,
   outbox rows, ...), each alone: the rows in a non-final state that nothing would move
   are given a way forward again, counted in ``hubdommed_stranded_rows_total{machine}``
   and logged once at warning; those a check cannot move itself are logged once (while
   they stay stranded) and shown in ``hubdommed_stranded_rows_unrepaired{machine}``;
5. delete the logs (output chunks) of jobs that finished more than
   ``JOB_OUTPUT_RETENTION_DAYS`` ago, a bounded number of chunks at a time
   (``job.retention``): at most once a minute, or on the next cycle again while a
   backlog lasts.

One line of counts per cycle at info. SIGTERM or SIGINT end the loop within a second
(the wait between cycles is cut in slices) and the process exits 0. Two monitors
running at once never settle a job twice (SKIP LOCKED, and the lease re-checked under
the lock); they may each re-send a power-on, which is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError
from django.utils import timezone

from automation.machines.services import machines_stop_idle
from common.daemon import Daemon
from common.metrics import Heartbeat, serve_metrics
from common.ways_forward import Repaired, stranded_checks
from job.monitor import (
    Settlement,
    job_settle_lost,
    jobs_renew_leases_after_outage,
    jobs_resend_power_on,
    jobs_restart_silent_workers,
    monitor_cycle_ended,
)
from job.monitor_metrics import (
    MONITOR_CYCLES,
    MONITOR_JOBS,
    MONITOR_STEP_ERRORS,
    OUTPUT_CHUNKS_DELETED,
    STRANDED_ROWS,
    STRANDED_UNREPAIRED,
)
from job.retention import BATCH_SIZE, BATCHES_PER_CALL, job_output_delete_expired
from job.selectors import automation_has_work, automation_ids_with_work, jobs_with_expired_lease
from lifecycle.failures import aborted_by, log_failure

logger = logging.getLogger("hubdommed.monitor")

# From the end of one cycle to the start of the next is at most the interval (less when a
# cycle is slow); longer than the interval plus this, and the monitor was not running.
OUTAGE_MARGIN_SECONDS = 5.0
# Seconds between two sweeps of expired output: a log expires days after its job's end, so
# a minute late costs nothing, and most cycles skip the sweep's queries altogether.
OUTPUT_SWEEP_SECONDS = 60.0


@dataclass
class StrandedCounts:
    """What the checks of ``common.ways_forward`` found in one cycle, by state machine."""

    # The machines whose check ran, and those whose check failed.
    ran: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    # The rows each repaired, and those each found stranded but could not move.
    repaired: Counter = field(default_factory=Counter)
    unrepaired: Counter = field(default_factory=Counter)

    def text(self) -> str:
        by_machine = ", ".join(
            f"{machine} {self.repaired[machine]}" for machine in self.ran if self.repaired[machine]
        )
        return (
            f"stranded rows: {sum(self.repaired.values())} repaired"
            + (f" ({by_machine})" if by_machine else "")
            + f", {sum(self.unrepaired.values())} left to an operator"
            + (f", checks failed: {', '.join(self.failed)}" if self.failed else "")
        )


@dataclass
class CycleCounts:
    leases_renewed: int = 0
    powered_on: int = 0
    workers_restarted: int = 0
    settled: Counter = field(default_factory=Counter)
    machines_stopped: int = 0
    stranded: StrandedCounts = field(default_factory=StrandedCounts)
    output_chunks_deleted: int = 0
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
            f"{self.machines_stopped} idle machines stopped; {self.stranded.text()}; "
            f"{self.errors} step errors"
            + (
                f"; {self.leases_renewed} leases renewed after an outage"
                if self.leases_renewed
                else ""
            )
            + (
                f"; {self.output_chunks_deleted} output chunks deleted past their retention"
                if self.output_chunks_deleted
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
        OUTPUT_CHUNKS_DELETED.inc(self.output_chunks_deleted)
        for machine in stranded_checks():
            STRANDED_ROWS.labels(machine=machine).inc(self.stranded.repaired[machine])
            if machine in self.stranded.ran:
                # What a check that ran saw; a failed check leaves its figure as it was.
                STRANDED_UNREPAIRED.labels(machine=machine).set(self.stranded.unrepaired[machine])


class Command(Daemon):
    help = (
        "Rescue stuck jobs: power machines on again for long-pending jobs, settle running "
        "jobs whose worker was lost, stop idle ec2 machines, and give a way forward again to "
        "the rows of every state machine that nothing would move, and delete the logs of "
        "jobs finished longer than JOB_OUTPUT_RETENTION_DAYS ago."
    )
    name = "monitor"
    interval_setting = "MONITOR_INTERVAL_SECONDS"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.heartbeat = Heartbeat("monitor", settings.LIVENESS_FILE)
        # The stranded rows a check could not move, by machine, as last reported: each is
        # logged when it first shows up, not again while it stays stranded.
        self.unrepaired: dict[str, set[tuple[str, str]]] = {}
        # The expired output sweep: when it last ran (monotonic), and whether it deleted
        # all it may at once (more is due: the next cycle sweeps again).
        self.output_swept_at: float | None = None
        self.output_backlog = False
        self.output_batch_size = BATCH_SIZE
        self.output_batches = BATCHES_PER_CALL

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
            except (OperationalError, InterfaceError) as exc:
                if aborted_by(exc) is None:
                    raise  # the database is away: the step fails once, not once per job
                # Another transaction's doing (a row another session keeps): this job
                # waits for the next cycle, the others go on.
                self._database_away("settle_lost_jobs", exc)
                settled["error"] += 1
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
            has_work=automation_has_work,
            stopping=lambda: self.shutdown,
        )

    def repair_stranded_rows(self) -> StrandedCounts:
        """Step 4: every state machine's check of rows with no way forward, each alone."""
        found = StrandedCounts()
        for machine, check in stranded_checks().items():
            if self.shutdown:
                break
            try:
                rows = check()
            except (OperationalError, InterfaceError) as exc:
                # The database is away: the checks after this one would only fail the same
                # way (not so for another transaction's doing). What the ones before
                # repaired is still counted.
                self._database_away("repair_stranded_rows", exc)
                found.failed.append(machine)
                if aborted_by(exc) is None:
                    break
            except Exception:
                # One broken check must not keep the others from finding their rows.
                logger.exception("monitor: the %s check of stranded rows failed", machine)
                found.failed.append(machine)
                MONITOR_STEP_ERRORS.labels(step=f"repair_stranded_rows.{machine}").inc()
                continue
            found.ran.append(machine)
            self._report_stranded(machine, rows, found)
        return found

    def delete_expired_output(self) -> int:
        """Step 5: the logs of jobs finished more than JOB_OUTPUT_RETENTION_DAYS ago, at
        most once every OUTPUT_SWEEP_SECONDS unless the last sweep left a backlog."""
        now = time.monotonic()
        if (
            not self.output_backlog
            and self.output_swept_at is not None
            and now - self.output_swept_at < OUTPUT_SWEEP_SECONDS
        ):
            return 0
        # Noted before the sweep: one that fails waits its turn too, not every cycle.
        self.output_swept_at, self.output_backlog = now, False
        deleted = job_output_delete_expired(
            batch_size=self.output_batch_size, batches=self.output_batches
        )
        self.output_backlog = deleted >= self.output_batch_size * self.output_batches
        return deleted

    def _report_stranded(self, machine: str, rows: list[Repaired], found: StrandedCounts) -> None:
        """Count and log what one check found. A repaired row was moved, so it is not found
        again; one left to an operator is found every cycle until someone acts, and logged
        only the first time (``self.unrepaired`` remembers the last cycle's)."""
        seen_before = self.unrepaired.get(machine, set())
        left: set[tuple[str, str]] = set()
        for row in rows:
            if row.repaired:
                found.repaired[machine] += 1
                outcome = "repaired"
            else:
                found.unrepaired[machine] += 1
                key = (row.row, row.problem)
                left.add(key)
                if key in seen_before:
                    continue
                outcome = "left to an operator"
            logger.warning(
                "stranded %s row %s: %s: %s; %s",
                machine,
                outcome,
                row.row,
                row.problem,
                row.action,
                extra={
                    "machine": machine,
                    "row": row.row,
                    "problem": row.problem,
                    "action": row.action,
                    "repaired": row.repaired,
                },
            )
        self.unrepaired[machine] = left

    def _database_away(self, step: str, exc: Exception) -> None:
        # One line, no traceback; the next step (or cycle) starts on a new connection.
        log_failure(logger, exc, "monitor step %s", step)
        self.drop_connection()
        MONITOR_STEP_ERRORS.labels(step=step).inc()

    # -- the cycle (lifecycle.daemon runs it) --------------------------------------------------

    def cycle(self) -> CycleCounts:
        """Every step, each alone: one that fails is counted and the others still run."""
        counts = CycleCounts()
        for step, keep in (
            (self.renew_leases_after_outage, "leases_renewed"),
            (self.power_on_for_pending, "powered_on"),
            (self.restart_silent_workers, "workers_restarted"),
            (self.settle_lost_jobs, "settled"),
            (self.stop_idle_machines, "machines_stopped"),
            (self.repair_stranded_rows, "stranded"),
            (self.delete_expired_output, "output_chunks_deleted"),
        ):
            # A connection the database dropped is replaced before each step too: the
            # steps before may have taken long enough for it to go.
            self.guard_connection()
            try:
                setattr(counts, keep, step())
            except (OperationalError, InterfaceError) as exc:
                self._database_away(step.__name__, exc)
                counts.errors += 1
            except Exception:
                # AWS away, or a bug: the other steps still run.
                logger.exception("monitor step %s failed", step.__name__)
                counts.errors += 1
                MONITOR_STEP_ERRORS.labels(step=step.__name__).inc()
        self.guard_connection()
        try:
            monitor_cycle_ended()
        except Exception as exc:
            log_failure(logger, exc, "monitor could not record the end of its cycle")
            counts.errors += 1
            MONITOR_STEP_ERRORS.labels(step="monitor_cycle_ended").inc()
        counts.errors += len(counts.stranded.failed)
        counts.count()
        logger.info(counts.line())
        return counts

    def starting(self) -> None:
        serve_metrics("monitor")
        logger.info(
            "monitor starting: every %gs; pending after %ss; ec2 idle after %ss",
            self.interval,
            settings.MONITOR_PENDING_SECONDS,
            settings.MONITOR_EC2_IDLE_SECONDS,
        )
