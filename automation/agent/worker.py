"""The automation worker's loop: learn of jobs, claim within the limit, run, report.

Jobs are learnt of two ways, so the worker never depends on the queue alone: messages
on the automation's own queue (``offer``, fed by the queue consumer) and a periodic
poll of the hub. A refused claim is normal (another worker got there first, or the
automation is at its limit). The worker never runs more jobs at once than its
automation allows, shuts down cleanly on SIGTERM within a stop budget, and exits after
an idle time (a local machine powering off).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from automation.agent.client import AutomationInfo, ClaimRefused, HubClient, HubError
from automation.agent.executor import Outcome, run_claimed_job
from relay.transports.consume import BadMessage

logger = logging.getLogger("hubdommed.agent")

# Waiting between reports the hub could not take (it is unreachable, or answers 5xx while
# its database restarts): doubling, within the job's lease.
REPORT_RETRY_FIRST = 0.5
REPORT_RETRY_MAX = 5.0


@dataclass
class AgentStats:
    claimed: int = 0
    refused: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    errors: list[str] = field(default_factory=list)


class AutomationWorker:
    def __init__(
        self,
        client: HubClient,
        automation: AutomationInfo,
        *,
        poll_interval: float = 5.0,
        idle_timeout: float | None = None,
        stop_budget: float = 30.0,
        heartbeat_interval: float | None = None,
    ) -> None:
        self.client = client
        self.automation = automation
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.stop_budget = stop_budget
        self.heartbeat_interval = heartbeat_interval
        self.stats = AgentStats()
        # Set by the signal handlers; the loop only reads them.
        self.shutdown = threading.Event()
        self.stopping_jobs = threading.Event()
        self._slots = threading.BoundedSemaphore(automation.max_concurrency)
        self._candidates: queue.Queue[int] = queue.Queue()
        self._queued: set[int] = set()
        self._queued_lock = threading.Lock()
        self._running: dict[int, threading.Thread] = {}
        self._last_activity = time.monotonic()

    # -- what the queue consumer calls -----------------------------------------------------
    def offer(self, job_id: int) -> None:
        """A job may be waiting: try to claim it soon (duplicates are ignored)."""
        with self._queued_lock:
            if job_id in self._queued or job_id in self._running:
                return
            self._queued.add(job_id)
        self._candidates.put(job_id)

    # -- the loop --------------------------------------------------------------------------
    def run(self, *, release_machine: Callable[[], None] | None = None) -> AgentStats:
        """Work until shut down, or until idle for ``idle_timeout``.

        Going idle, the worker first lets go of its machine (``release_machine``: a new
        power-on may start another worker from then on), then polls one last time and
        runs what it finds. A job created in between is thus either found by this poll or
        powers on a new worker; it never waits for the stuck-job monitor.
        """
        next_poll = 0.0
        released = False
        while not self.shutdown.is_set():
            if time.monotonic() >= next_poll:
                self.poll_once()
                next_poll = time.monotonic() + self.poll_interval
            if self.claim_next(timeout=min(0.5, self.poll_interval)) or not self._idle_too_long():
                continue
            if released:
                break
            logger.info("idle for %.0f s: the worker stops", self.idle_timeout)
            if release_machine is not None:
                release_machine()
            released = True
            if self.poll_once():
                self._last_activity = time.monotonic()
        self._drain()
        return self.stats

    def poll_once(self) -> int:
        try:
            job_ids = self.client.pending_jobs(limit=max(20, self.automation.max_concurrency * 4))
        except HubError as exc:
            logger.warning("poll failed, will try again: %s", exc)
            return 0
        for job_id in job_ids:
            self.offer(job_id)
        return len(job_ids)

    def claim_next(self, *, timeout: float) -> bool:
        """One step: take a candidate, wait for a free slot, claim it. True if it claimed."""
        try:
            job_id = self._candidates.get(timeout=timeout)
        except queue.Empty:
            return False
        with self._queued_lock:
            self._queued.discard(job_id)
        while not self._slots.acquire(timeout=0.5):
            if self.shutdown.is_set():
                return False
        try:
            job = self.client.claim(job_id)
        except ClaimRefused as exc:
            self._slots.release()
            self.stats.refused += 1
            logger.info("job %s: claim refused (%s)", job_id, exc.code)
            return False
        except HubError as exc:
            self._slots.release()
            logger.warning("job %s: claim failed, the poll will offer it again: %s", job_id, exc)
            return False
        self.stats.claimed += 1
        self._last_activity = time.monotonic()
        thread = threading.Thread(target=self._run_job, args=(job,), name=f"job-{job_id}")
        with self._queued_lock:
            self._running[job_id] = thread
        thread.start()
        return True

    def _run_job(self, job: dict) -> None:
        job_id = job["id"]
        try:
            outcome = run_claimed_job(
                self.client,
                job=job,
                command=self.automation.command,
                timeout_seconds=self.automation.timeout_seconds,
                heartbeat_interval=self._heartbeat_interval(job),
                stopping=self.stopping_jobs,
            )
            self._report(job, outcome)
        except Exception as exc:  # a bug here must not kill the worker or leak the slot
            logger.exception("job %s: unexpected error in the worker", job_id)
            self.stats.errors.append(f"{job_id}: {exc}")
        finally:
            with self._queued_lock:
                self._running.pop(job_id, None)
            self._last_activity = time.monotonic()
            self._slots.release()

    def _report(self, job: dict, outcome: Outcome) -> None:
        job_id, token = job["id"], str(job["claim_token"])
        if outcome.claim_lost:
            self.stats.lost += 1
            return
        # The command has run: its outcome is worth waiting for the hub. Given up, the
        # lease runs out and the job is run again (or failed) by the monitor. Until the
        # lease would have run out anyway, a hub briefly away is asked again.
        deadline = time.monotonic() + 3 * self._heartbeat_interval(job)
        delay = REPORT_RETRY_FIRST
        while True:
            try:
                self._send_report(job_id, token, outcome)
                return
            except HubError as exc:
                # A refusal (4xx: the job is no longer this worker's) is final.
                transient = exc.status is None or exc.status >= 500
                if not transient or time.monotonic() + delay > deadline:
                    logger.error("job %s: could not report the outcome: %s", job_id, exc)
                    self.stats.errors.append(f"{job_id}: {exc}")
                    return
                logger.warning(
                    "job %s: the hub could not take the report (%s); again in %.1f s",
                    job_id,
                    exc,
                    delay,
                )
                time.sleep(delay)
                delay = min(REPORT_RETRY_MAX, delay * 2)

    def _send_report(self, job_id: int, token: str, outcome: Outcome) -> None:
        if outcome.succeeded:
            self.client.complete(
                job_id,
                token,
                result={"exit_code": outcome.exit_code},
                output_tail=outcome.output_tail,
                exit_code=outcome.exit_code,
            )
            self.stats.succeeded += 1
            logger.info("job %s succeeded", job_id)
        else:
            self.client.fail(
                job_id,
                token,
                # The hub turns a failure of a job being canceled into "canceled".
                reason=outcome.reason if outcome.reason in ("exit_code", "timeout") else "error",
                error=outcome.error,
                output_tail=outcome.output_tail,
                exit_code=outcome.exit_code,
            )
            self.stats.failed += 1
            logger.info("job %s failed: %s", job_id, outcome.error)

    def _heartbeat_interval(self, job: dict) -> float:
        """A third of the lease the claim granted, so two beats can be missed safely."""
        if self.heartbeat_interval:
            return self.heartbeat_interval
        try:
            granted = datetime.fromisoformat(job["lease_expires_at"]) - datetime.fromisoformat(
                job["started_at"]
            )
        except (KeyError, TypeError, ValueError):
            return 10.0
        return max(0.2, granted.total_seconds() / 3)

    def _idle_too_long(self) -> bool:
        if self.idle_timeout is None:
            return False
        with self._queued_lock:
            busy = bool(self._running) or bool(self._queued)
        return not busy and time.monotonic() - self._last_activity >= self.idle_timeout

    def _drain(self) -> None:
        """Let running jobs finish within the stop budget; then stop their commands."""
        deadline = time.monotonic() + self.stop_budget
        for thread in list(self._running.values()):
            thread.join(max(0.0, deadline - time.monotonic()))
        if any(thread.is_alive() for thread in list(self._running.values())):
            logger.warning("stop budget spent: stopping the commands still running")
            self.stopping_jobs.set()
            for thread in list(self._running.values()):
                thread.join(30)


class JobOfferProcessor:
    """The runtime's processor for an automation's queue: each message offers a job.

    The message is acknowledged as soon as the job is offered: if this worker dies before
    claiming it, the job is still pending and the poll (this worker's or another's) finds it.
    """

    def __init__(self, consumer, worker: AutomationWorker) -> None:
        self.consumer = consumer
        self.worker = worker

    def process(self, delivery) -> None:
        with delivery.settling() as mine:
            if not mine:
                return
            try:
                job_id = delivery.envelope["payload"]["job_id"]
            except (BadMessage, KeyError, TypeError):
                logger.warning("dropping a message that names no job: %r", delivery.body[:200])
            else:
                if isinstance(job_id, int):
                    self.worker.offer(job_id)
            self.consumer.ack(delivery)

    def released(self, delivery) -> None:
        """Nothing to record: the automation worker keeps no bookkeeping of messages."""

    def thread_done(self) -> None:
        """No per-thread resources (no database)."""
