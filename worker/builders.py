"""How the two runtimes are put together over the consume loop: the one place that wires
them, used by ``manage.py run_worker`` and by the tests and benchmarks alike.

- ``build_task_worker``: the hub's background worker, the task processor (``task_runs``,
  retries, dead letters) over a ``ConsumeLoop`` on the queue classes given;
- ``build_automation_worker``: an automation's own worker (``automation.agent``), no
  database, its job offers from its automation's queue over the same loop.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from automation.agent.client import AutomationInfo, HubClient
from automation.agent.spool import OutcomeSpool
from automation.agent.worker import AutomationWorker, JobOfferProcessor
from broker import get_consumer
from broker.consume import Consumer
from broker.consume_loop import ConsumeLoop, LoopStats
from broker.topology import automation_queue_name
from common.metrics import Heartbeat
from outbox.catalog import get_catalog
from outbox.runs import RunLedger
from worker.come_back import for_consumer
from worker.processor import TaskProcessor
from worker.registry import discover_handlers, missing_handlers

logger = logging.getLogger("hubdommed.worker")

# A task worker's window (``window_for``): the messages the broker may hand it,
# ``WORKER_PREFETCH_PER_SLOT`` per slot (16 unless configured), over all the queues it
# consumes (RabbitMQ's consumers share it among its queues). More than one: a slot that
# finishes finds its next message waiting, and the runs of a window are claimed (and its
# outcomes committed) together, so the window's depth is what pays for the two durable
# records' round trips (docs/PERFORMANCE.md has the rates of 8, 16, 32 and 64 per slot).
# The price: messages of long tasks wait in one worker (claimed) while another could
# take them. After a crash, on RabbitMQ, the ones not started are free within seconds
# (``worker.leases``); on SQS they come back with their visibility, as the running ones.


def window_for(concurrency: int) -> int:
    """The messages a task worker with this many slots may hold at once."""
    return concurrency * settings.WORKER_PREFETCH_PER_SLOT


@dataclass
class TaskWorker:
    consumer: Consumer
    processor: TaskProcessor
    loop: ConsumeLoop

    def run(self) -> LoopStats:
        return self.loop.run()

    def summary(self, stats: LoopStats) -> str:
        outcomes = " ".join(
            f"{name}={count}" for name, count in sorted(self.processor.outcomes.items())
        )
        return f"worker stopped: {stats.received} received, {stats.given_back} given back" + (
            f", {outcomes}" if outcomes else ""
        )


def build_task_worker(
    destinations: Sequence[str],
    *,
    concurrency: int,
    stop_budget: float,
    ready_file: str | Path | None = None,
    poll_interval: float = 0.2,
) -> TaskWorker:
    """The background worker for these queue classes, its handlers discovered."""
    handlers = discover_handlers()
    missing = missing_handlers(get_catalog(), list(destinations), handlers)
    if missing:
        # Their messages would be dead-lettered: say so at start, not per message.
        logger.warning("no handler for tasks %s", ", ".join(missing))
    consumer = get_consumer()
    # How a retry comes back (the broker's delay, or the outbox row re-armed) is decided
    # here, once, by what this broker can do.
    ledger = RunLedger()
    processor = TaskProcessor(consumer, ledger, come_back=for_consumer(consumer, ledger))
    loop = ConsumeLoop(
        consumer,
        destinations,
        processor,
        concurrency=concurrency,
        stop_budget=stop_budget,
        ready_file=ready_file,
        poll_interval=poll_interval,
        prefetch=window_for(concurrency),
        on_received=processor.received,
        on_step=_WindowedBeat(Heartbeat("worker", settings.LIVENESS_FILE), processor.window),
    )
    processor.on_abandon = loop.replace_slot
    # The window hands each delivery whose run it claimed to the loop's slots.
    processor.window.hand_over = loop.hand_over
    return TaskWorker(consumer, processor, loop)


class _WindowedBeat:
    """The task worker's sign of life: its consume loop's turns, while its window's
    bookkeeping also moves. A claim or a group commit under way for
    ``WORKER_STALL_SECONDS`` (a database hung mid-answer) stops the beats, so the liveness
    file ages and the health check fails, and is said once as an error; the beats come
    back when it ends."""

    def __init__(self, heartbeat: Heartbeat, window) -> None:
        self.heartbeat = heartbeat
        self.window = window
        self._said = False

    def __call__(self) -> None:
        stalled = self.window.stalled()
        if stalled < settings.WORKER_STALL_SECONDS:
            if self._said:
                logger.warning("worker: its runs' bookkeeping moves again")
                self._said = False
            self.heartbeat.beat()
        elif not self._said:
            self._said = True
            logger.error(
                "worker: a statement of its runs' bookkeeping has had no answer for %.0f s "
                "(a database that stopped answering?): no more signs of life until it ends",
                stalled,
            )


@dataclass
class AutomationRuntime:
    client: HubClient
    agent: AutomationWorker
    loop: ConsumeLoop

    def run(
        self,
        *,
        release_machine: Callable[[], None] | None = None,
        reclaim_machine: Callable[[], bool] | None = None,
    ) -> str:
        """Consume the automation's queue and run its jobs until idle or stopped (the
        machine let go of and taken back as ``AutomationWorker.run`` tells)."""

        def run_jobs() -> None:
            try:
                self.agent.run(release_machine=release_machine, reclaim_machine=reclaim_machine)
            finally:
                self.loop.stop()  # idle, or shutting down: the queue consumer stops too

        jobs = threading.Thread(target=run_jobs, name="automation-worker")
        jobs.start()
        self.loop.run()
        self.agent.shutdown.set()
        jobs.join()
        self.client.close()
        stats = self.agent.stats
        return (
            f"worker of {self.agent.automation.slug} stopped: {stats.claimed} claimed, "
            f"{stats.succeeded} succeeded, {stats.failed} failed, {stats.refused} refused, "
            f"{stats.lost} lost"
        )


def build_automation_worker(
    client: HubClient,
    info: AutomationInfo,
    *,
    poll_interval: float,
    idle_timeout: float | None,
    outcomes_dir: Path,
    ready_file: str | Path | None = None,
) -> AutomationRuntime:
    """An automation's worker: the agent, and its queue's offers over a consume loop."""
    agent = AutomationWorker(
        client,
        info,
        poll_interval=poll_interval,
        idle_timeout=idle_timeout,
        stop_budget=settings.WORKER_STOP_BUDGET,
        spool=OutcomeSpool(outcomes_dir),
        report_backoff_cap=settings.AGENT_REPORT_BACKOFF_MAX,
    )
    consumer = get_consumer()
    loop = ConsumeLoop(
        consumer,
        [automation_queue_name(info.id)],
        JobOfferProcessor(consumer, agent),
        concurrency=1,
        stop_budget=0,
        ready_file=ready_file,
    )
    # A stop of the loop (a signal) is the agent's stop too.
    loop.stop_flag.on_stop(agent.shutdown.set)
    return AutomationRuntime(client, agent, loop)
