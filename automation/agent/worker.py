"""The automation worker's loop: learn of jobs, claim within the limit, run, report.

Jobs are learnt of two ways, so the worker never depends on the queue alone: messages
on the automation's own queue (``offer``, fed by the queue consumer) and a periodic
poll of the hub. A refused claim is normal (another worker got there first, or the
automation is at its limit). The worker never runs more jobs at once than its
automation allows, shuts down cleanly on SIGTERM within a stop budget, and exits after
an idle time (a local machine powering off).

An outcome is never dropped: it is kept on the machine's disk (``OutcomeSpool``) before
the first attempt to report it, and the report is tried again, with growing pauses,
while the hub is unreachable or failing (5xx, 429); a shutdown stops trying once its stop
budget is spent and leaves the outcome on disk, which the next worker on the machine
reports before anything else. A 401 means the credential was rotated: the worker stops
taking jobs and exits (keeping any outcome on disk), so that its machine's provider
starts one with the new credential.

A job learnt of from its message comes with the ids of the request that created it (its
correlation id, tenant and trace: ``JobIds``): the worker's log lines about the job carry
them, and so do its requests to the hub for it (claim, heartbeats, report), so that the
job is one trace from the request that created it to the report that ended it. A job
found by the poll alone comes with its trace only (the poll's answer carries it).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from functools import partial

from automation.agent.client import (
    AutomationInfo,
    ClaimRefused,
    HubClient,
    HubError,
    JobIds,
    for_job,
)
from automation.agent.executor import Outcome, run_claimed_job
from automation.agent.output import UnsentOutput
from automation.agent.spool import OutcomeSpool, Report
from broker.consume import BadMessage
from common import tracing
from common.context import log_context
from lifecycle import Backoff

logger = logging.getLogger("hubdommed.agent")

# A claim whose answer did not come (the hub unreachable, the connection cut) is sent
# again, the same claim, for this long: the hub may have made it. Well within the
# claim's lease (JOB_LEASE_SECONDS, 60 s by default), after which the hub's monitor
# takes the job back anyway.
CLAIM_RETRY_SECONDS = 20.0
CLAIM_RETRY_FIRST = 0.2
CLAIM_RETRY_CAP = 5.0


@dataclass
class AgentStats:
    claimed: int = 0
    refused: int = 0
    succeeded: int = 0
    failed: int = 0
    lost: int = 0
    # Outcomes reported from the disk, kept by an earlier worker on this machine.
    recovered: int = 0
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
        spool: OutcomeSpool | None = None,
        report_backoff_cap: float = 30.0,
    ) -> None:
        self.client = client
        self.spool = spool
        self.report_backoff_cap = report_backoff_cap
        # Set when the hub refuses the credential: this worker can do nothing more.
        self.credential_refused = False
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
        # What the messages told of the jobs offered and not claimed yet.
        self._ids: dict[int, JobIds] = {}
        self._queued_lock = threading.Lock()
        self._running: dict[int, threading.Thread] = {}
        self._last_activity = time.monotonic()

    # -- what the queue consumer calls -----------------------------------------------------
    def offer(self, job_id: int, ids: JobIds | None = None) -> None:
        """A job may be waiting: try to claim it soon (duplicates are ignored)."""
        with self._queued_lock:
            if ids is not None:
                # The message's and the poll's ids are the same job's: whichever came
                # first, the other fills what it lacks (the poll knows no tenant).
                known = self._ids.get(job_id)
                self._ids[job_id] = ids if known is None else known.filled_from(ids)
            if job_id in self._queued or job_id in self._running:
                return
            self._queued.add(job_id)
        self._candidates.put(job_id)

    # -- the loop --------------------------------------------------------------------------
    def run(
        self,
        *,
        release_machine: Callable[[], None] | None = None,
        reclaim_machine: Callable[[], bool] | None = None,
    ) -> AgentStats:
        """Work until shut down, or until idle for ``idle_timeout``.

        Going idle, the worker first lets go of its machine (``release_machine``: a new
        power-on may start another worker from then on), then polls one last time. A job
        created in between is thus found by this poll or powers on a new worker, or both:
        what the poll finds is run here only once the worker has its machine back
        (``reclaim_machine``); when a new worker took it first, the job is that worker's
        (and this one's credential is about to be replaced). It never waits for the
        stuck-job monitor.
        """
        next_poll = 0.0
        released = False
        self.report_spooled()
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
                if reclaim_machine is not None:
                    if not reclaim_machine():
                        logger.info("another worker took this machine: its jobs are that worker's")
                        self._forget_candidates()
                        break
                    # The machine is this worker's again, to let go of when idle again.
                    released = False
                self._last_activity = time.monotonic()
        self._drain()
        return self.stats

    def _forget_candidates(self) -> None:
        """The jobs offered and not claimed: left to whoever claims them."""
        with self._queued_lock:
            self._queued.clear()
            self._ids.clear()
        while True:
            try:
                self._candidates.get_nowait()
            except queue.Empty:
                return

    def report_spooled(self) -> int:
        """Report, first of all, the outcomes an earlier worker left on this machine's disk
        (each on a thread of its own, retrying while the hub does not answer)."""
        if self.spool is None:
            return 0
        reports = self.spool.pending()
        for report in reports:
            job_id = int(report["job_id"])
            logger.info("job %s: reporting the outcome kept on disk", job_id)
            self._start(job_id, self._report_spooled, report, name=f"spooled-{job_id}")
        return len(reports)

    def _report_spooled(self, report: Report) -> None:
        job_id = int(report["job_id"])
        try:
            if self._deliver(report):
                self.stats.recovered += 1
        except Exception as exc:
            logger.exception("job %s: unexpected error reporting the kept outcome", job_id)
            self.stats.errors.append(f"{job_id}: {exc}")
        finally:
            self._gone(job_id)

    def _start(self, job_id: int, target, *args, name: str) -> None:
        # ``_running`` holds the threads of the jobs this worker has in hand: _drain waits for them.
        thread = threading.Thread(target=target, args=args, name=name)
        with self._queued_lock:
            self._running[job_id] = thread
        thread.start()

    def _gone(self, job_id: int) -> None:
        with self._queued_lock:
            self._running.pop(job_id, None)
        self._last_activity = time.monotonic()

    def poll_once(self) -> int:
        try:
            jobs = self.client.pending_jobs(limit=max(20, self.automation.max_concurrency * 4))
        except HubError as exc:
            if exc.credential_refused:
                self._refused(exc)
            logger.warning("poll failed, will try again: %s", exc)
            return 0
        for job in jobs:
            # The ids of the request that created the job: its claim, heartbeats and
            # report carry them, whichever of the poll and the message comes first.
            ids = _ids_of(job)
            self.offer(job["id"], ids if ids.correlation_id or ids.traceparent else None)
        return len(jobs)

    def claim_next(self, *, timeout: float) -> bool:
        """One step: take a candidate, wait for a free slot, claim it. True if it claimed."""
        try:
            job_id = self._candidates.get(timeout=timeout)
        except queue.Empty:
            return False
        with self._queued_lock:
            self._queued.discard(job_id)
            ids = self._ids.pop(job_id, None) or JobIds()
        while not self._slots.acquire(timeout=0.5):
            if self.shutdown.is_set():
                return False
        with _about(job_id, ids):
            return self._claim(job_id, ids)

    def _claim(self, job_id: int, ids: JobIds) -> bool:
        # Named here, so that a claim whose answer is lost can be sent again: the hub may
        # have made it, and then answers the same claim again, where a new one would find
        # the job taken and leave it running under a lease nobody holds.
        token = str(uuid.uuid4())
        backoff = Backoff(CLAIM_RETRY_FIRST, CLAIM_RETRY_CAP, jitter=True)
        give_up_at = time.monotonic() + CLAIM_RETRY_SECONDS
        while True:
            try:
                with tracing.maybe_span(
                    "agent.claim",
                    traceparent=ids.traceparent,
                    attributes={"hubdommed.job_id": job_id},
                ):
                    job = self.client.claim(job_id, claim_token=token)
                break
            except ClaimRefused as exc:
                self._slots.release()
                self.stats.refused += 1
                logger.info("job %s: claim refused (%s)", job_id, exc.code)
                return False
            except HubError as exc:
                if exc.credential_refused:
                    self._refused(exc)
                elif exc.retryable and time.monotonic() < give_up_at:
                    pause = backoff.failed()
                    logger.warning(
                        "job %s: could not claim it yet, trying again in %.1f s: %s",
                        job_id,
                        pause,
                        exc,
                    )
                    if not self.shutdown.wait(pause):
                        continue
                self._slots.release()
                logger.warning(
                    "job %s: claim failed, the poll will offer it again: %s", job_id, exc
                )
                return False
        self.stats.claimed += 1
        self._last_activity = time.monotonic()
        self._start(job_id, self._run_job, job, ids, name=f"job-{job_id}")
        return True

    def _run_job(self, job: dict, ids: JobIds) -> None:
        job_id = job["id"]
        try:
            with (
                _about(job_id, ids),
                tracing.maybe_span(
                    "agent.job",
                    traceparent=ids.traceparent,
                    attributes={
                        "hubdommed.job_id": job_id,
                        "hubdommed.attempt": job.get("attempt"),
                    },
                ),
            ):
                outcome = run_claimed_job(
                    self.client,
                    job=job,
                    command=self.automation.command,
                    timeout_seconds=self.automation.timeout_seconds,
                    heartbeat_interval=self._heartbeat_interval(job),
                    stopping=self.stopping_jobs,
                )
                self._report(job, outcome, ids)
        except Exception as exc:  # a bug here must not kill the worker or leak the slot
            logger.exception("job %s: unexpected error in the worker", job_id)
            self.stats.errors.append(f"{job_id}: {exc}")
        finally:
            self._gone(job_id)
            self._slots.release()

    def _report(self, job: dict, outcome: Outcome, ids: JobIds) -> None:
        if outcome.claim_lost:
            self.stats.lost += 1
            return
        report = report_of(job, outcome, ids)
        if self.spool is not None:
            # Before the first attempt: from now on a crash or a stop cannot lose it.
            self.spool.put(report)
        self._deliver(report)

    def _deliver(self, report: Report) -> bool:
        """Send the report until the hub answers; True if it took it.

        Tried again while the hub is unreachable or failing; a shutdown gives up once its
        stop budget is spent (the outcome stays on disk). A refusal is final: the outcome
        leaves the disk, except a refused credential's (the next worker reports it).
        """
        ids = _ids_of_report(report)
        # The job's span, when this thread runs it; else (an outcome kept on disk by an
        # earlier worker) a span of the report's own in the job's trace.
        in_job = tracing.current_traceparent() is not None
        with (
            _about(int(report["job_id"]), ids),
            tracing.maybe_span(
                "agent.report",
                traceparent=None if in_job else ids.traceparent,
                attributes={"hubdommed.job_id": report["job_id"], "hubdommed.kind": report["kind"]},
            ),
        ):
            return self._send_report(report)

    def _send_report(self, report: Report) -> bool:
        job_id, token, kind = int(report["job_id"]), str(report["claim_token"]), report["kind"]
        send = self.client.complete if kind == "complete" else self.client.fail
        backoff = Backoff(0.5, self.report_backoff_cap, jitter=True)
        try:
            self._send_unsent_output(report, backoff)
            refusal = self._until_answered(
                job_id,
                "report the outcome",
                partial(send, job_id, token, **report["body"]),
                backoff,
            )
        except _KeptOnDisk:
            return False
        if refusal is not None:
            logger.error("job %s: the hub refused the outcome for good: %s", job_id, refusal)
            self.stats.errors.append(f"{job_id}: {refusal}")
            self._forget(report)
            return False
        self._forget(report)
        if kind == "complete":
            self.stats.succeeded += 1
            logger.info("job %s succeeded", job_id)
        else:
            self.stats.failed += 1
            logger.info("job %s failed: %s", job_id, report["body"].get("error", ""))
        return True

    def _send_unsent_output(self, report: Report, backoff: Backoff) -> None:
        """The output the hub had not taken when the command ended, before the outcome
        (which ends the job: the hub takes no output after it). Sent again from the disk,
        a chunk the hub has already stores nothing (its number is the same)."""
        if not report.get("output"):
            return
        job_id, token = int(report["job_id"]), str(report["claim_token"])
        try:
            unsent = UnsentOutput.from_dict(report["output"])
        except (KeyError, TypeError, ValueError) as exc:
            logger.error("job %s: the output kept with the outcome is unreadable: %s", job_id, exc)
            return
        for seq, text in enumerate(unsent.chunks, start=unsent.seq):
            refusal = self._until_answered(
                job_id,
                "send the rest of the output",
                partial(self.client.output, job_id, token, seq=seq, text=text),
                backoff,
            )
            if refusal is not None:
                # The job is someone else's or over: the outcome meets the same answer.
                logger.warning("job %s: the rest of the output is refused: %s", job_id, refusal)
                return
            backoff.reset()

    def _until_answered(
        self, job_id: int, what: str, call: Callable[[], object], backoff: Backoff
    ) -> HubError | None:
        """``call`` again until the hub answers: None once it took it, its refusal when
        sending again cannot change the answer. ``_KeptOnDisk`` when the report must wait
        for the next worker: the credential was refused, or a stop spent its budget."""
        while True:
            try:
                call()
            except HubError as exc:
                if exc.credential_refused:
                    self._refused(exc)
                    logger.error(
                        "job %s: the hub refused this worker's credential; the outcome stays "
                        "on disk for the next worker: %s",
                        job_id,
                        exc,
                    )
                    raise _KeptOnDisk from exc
                if not exc.retryable:
                    return exc
                pause = backoff.failed()
                logger.warning(
                    "job %s: could not %s yet, trying again in %.1f s: %s", job_id, what, pause, exc
                )
                # Stopping, with the stop budget spent: keep it on disk for the next start.
                if self.stopping_jobs.wait(pause):
                    logger.warning(
                        "job %s: stopping; the outcome stays on disk for the next start", job_id
                    )
                    raise _KeptOnDisk from exc
                continue
            return None

    def _forget(self, report: Report) -> None:
        if self.spool is not None:
            self.spool.remove(report)

    def _refused(self, exc: HubError) -> None:
        """The credential was rotated (or the worker retired): stop taking jobs and exit,
        so that the machine's provider starts a worker with the new credential."""
        if not self.credential_refused:
            logger.error("the hub refuses this worker's credential; the worker stops: %s", exc)
        self.credential_refused = True
        self.shutdown.set()

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


class _KeptOnDisk(Exception):
    """The report waits on disk for the next worker."""


@contextmanager
def _about(job_id: int, ids: JobIds) -> Iterator[None]:
    """The block's log lines and requests to the hub carry the job's ids."""
    with (
        log_context(correlation_id=ids.correlation_id, job_id=job_id, tenant_id=ids.tenant_id),
        for_job(ids),
    ):
        yield


def report_of(job: dict, outcome: Outcome, ids: JobIds | None = None) -> Report:
    """The request that reports ``outcome`` of the claimed ``job``, as kept on disk (with
    the job's ids, for the next worker's report of it)."""
    if outcome.succeeded:
        body = {
            "result": {"exit_code": outcome.exit_code},
            "output_tail": outcome.output_tail,
            "exit_code": outcome.exit_code,
        }
    else:
        body = {
            # The hub turns a failure of a job being canceled into "canceled".
            "reason": outcome.reason if outcome.reason in ("exit_code", "timeout") else "error",
            "error": outcome.error,
            "output_tail": outcome.output_tail,
            "exit_code": outcome.exit_code,
        }
    report: Report = {
        "job_id": int(job["id"]),
        "claim_token": str(job["claim_token"]),
        "kind": "complete" if outcome.succeeded else "fail",
        "body": body,
    }
    if outcome.unsent_output is not None:
        report["output"] = outcome.unsent_output.as_dict()
    if ids is not None and ids != JobIds():
        report["ids"] = {key: value for key, value in asdict(ids).items() if value is not None}
    return report


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
                envelope = delivery.envelope
                job_id = envelope["payload"]["job_id"]
            except (BadMessage, KeyError, TypeError):
                logger.warning("dropping a message that names no job: %r", delivery.body[:200])
            else:
                if isinstance(job_id, int):
                    self.worker.offer(job_id, _ids_of(envelope))
            self.consumer.ack(delivery)

    def released(self, delivery) -> None:
        """Nothing to record: the automation worker keeps no bookkeeping of messages."""

    def thread_done(self) -> None:
        """No per-thread resources (no database)."""

    def stopped(self) -> None:
        """No threads of its own: the agent's are stopped by its runtime."""


def _ids_of(envelope: dict) -> JobIds:
    """The ids of the request that created the job, from its message's envelope."""
    correlation_id, tenant = envelope.get("correlation_id"), envelope.get("tenant")
    traceparent = envelope.get("traceparent")
    return JobIds(
        correlation_id=correlation_id
        if isinstance(correlation_id, str) and correlation_id
        else None,
        tenant_id=tenant if isinstance(tenant, int) and not isinstance(tenant, bool) else None,
        traceparent=traceparent if isinstance(traceparent, str) and traceparent else None,
    )


def _ids_of_report(report: Report) -> JobIds:
    """The job's ids kept with its outcome (none from an older worker's, or a damaged one)."""
    ids = report.get("ids")
    if not isinstance(ids, dict):
        return JobIds()
    return _ids_of(
        {
            "correlation_id": ids.get("correlation_id"),
            "tenant": ids.get("tenant_id"),
            "traceparent": ids.get("traceparent"),
        }
    )
