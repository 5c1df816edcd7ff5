"""``manage.py run_worker``: run background tasks, or an automation's jobs, until told to stop.

Two roles on one runtime (``outbox.runtime``):

- ``run_worker --queues critical,default``: the hub's background worker. It runs the task
  handlers found in each app's ``tasks.py`` (docs/worker.md).
- ``run_worker --automation <slug>``: the worker on an automation's machine. It needs only
  the hub's URL (``HUB_URL``), its credential (``HUBDOMMED_WORKER_CREDENTIAL``) and the
  broker, no database: it consumes its automation's own queue, polls the hub too, and runs
  the automation's command for each job it claims (``automation.agent``).

Thin on purpose: this wires things together; the behaviour lives in those modules.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from automation.agent.client import HubClient, HubError
from automation.agent.worker import AutomationWorker, JobOfferProcessor
from automation.machines.local import LOCK_FD_ENV
from outbox.catalog import get_catalog
from outbox.models import QUEUES
from outbox.runtime.loop import Worker
from outbox.runtime.processor import TaskProcessor
from outbox.runtime.registry import discover_handlers
from outbox.services import automation_queue_name
from relay.transports.consume import get_consumer

logger = logging.getLogger("hubdommed.worker")


def parse_queues(value: str | list[str]) -> list[str]:
    names = value.split(",") if isinstance(value, str) else list(value)
    queues = [name.strip() for name in names if name.strip()]
    unknown = [name for name in queues if name not in QUEUES]
    if unknown or not queues:
        raise CommandError(
            f"unknown queue(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(QUEUES)}"
        )
    return list(dict.fromkeys(queues))


class Command(BaseCommand):
    help = "Run background tasks from the given queues (default: QUEUES)."

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            default=",".join(settings.QUEUES),
            help="comma-separated queue classes, in order of priority (default: QUEUES)",
        )
        parser.add_argument(
            "--automation",
            metavar="SLUG",
            help="run this automation's jobs (the worker of its machine) instead of tasks",
        )
        parser.add_argument(
            "--poll-interval",
            type=float,
            default=settings.AGENT_POLL_INTERVAL,
            help="with --automation: seconds between polls of the hub "
            "(default: AGENT_POLL_INTERVAL)",
        )
        parser.add_argument(
            "--idle-timeout",
            type=float,
            default=settings.AGENT_IDLE_TIMEOUT,
            help="with --automation: exit after this many idle seconds, 0 never "
            "(default: AGENT_IDLE_TIMEOUT)",
        )
        parser.add_argument(
            "--concurrency",
            type=int,
            default=settings.WORKER_CONCURRENCY,
            help="tasks in flight at once in this process (default: WORKER_CONCURRENCY)",
        )

    def handle(self, *args, queues: str, concurrency: int, automation: str | None, **options):
        if automation:
            return self.run_automation_worker(
                automation,
                poll_interval=options["poll_interval"],
                idle_timeout=options["idle_timeout"] or None,
            )
        destinations = parse_queues(queues)
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        handlers = discover_handlers()
        catalog = get_catalog()
        missing = sorted(
            spec.name
            for spec in catalog.tasks.values()
            if spec.destination == "queue"
            and spec.queue in destinations
            and spec.name not in handlers
        )
        if missing:
            # Their messages would be dead-lettered: say so at start, not per message.
            logger.warning("no handler for tasks %s", ", ".join(missing))
        consumer = get_consumer()
        processor = TaskProcessor(consumer)
        worker = Worker(
            consumer,
            destinations,
            processor,
            concurrency=concurrency,
            stop_budget=settings.WORKER_STOP_BUDGET,
            ready_file=settings.WORKER_READY_FILE or None,
        )
        self._install_signals(worker)
        stats = worker.run()
        outcomes = " ".join(f"{name}={count}" for name, count in sorted(processor.outcomes.items()))
        summary = f"worker stopped: {stats.received} received, {stats.given_back} given back" + (
            f", {outcomes}" if outcomes else ""
        )
        self._exit_now(summary)

    def _exit_now(self, summary: str) -> None:
        """The stop is done within its budget: what did not finish was given back, and
        handler threads still stuck are only left to die. Leave now, without the
        interpreter's teardown of a process this size, which alone may take seconds on a
        busy machine and would push the exit past the budget an orchestrator allows."""
        self.stdout.write(summary)
        self.stdout.flush()
        self.stderr.flush()
        connections.close_all()
        logging.shutdown()
        os._exit(0)

    def run_automation_worker(
        self, slug: str, *, poll_interval: float, idle_timeout: float | None
    ) -> str:
        credential = os.environ.get("HUBDOMMED_WORKER_CREDENTIAL", "")
        if not credential:
            raise CommandError("HUBDOMMED_WORKER_CREDENTIAL must hold this worker's credential")
        client = HubClient(settings.HUB_URL, credential)
        try:
            info = client.me()
        except HubError as exc:
            raise CommandError(f"cannot reach the hub at {settings.HUB_URL}: {exc}") from exc
        if info.slug != slug:
            raise CommandError(f"this credential belongs to automation {info.slug!r}, not {slug!r}")
        agent = AutomationWorker(
            client,
            info,
            poll_interval=poll_interval,
            idle_timeout=idle_timeout,
            stop_budget=settings.WORKER_STOP_BUDGET,
        )
        consumer = get_consumer()
        loop = Worker(
            consumer,
            [automation_queue_name(info.id)],
            JobOfferProcessor(consumer, agent),
            concurrency=1,
            stop_budget=0,
            ready_file=settings.WORKER_READY_FILE or None,
        )

        def run_jobs() -> None:
            try:
                agent.run(release_machine=release_machine_lock)
            finally:
                loop.stop()  # idle, or shutting down: the queue consumer stops too

        jobs = threading.Thread(target=run_jobs, name="automation-worker")
        self._install_signals(loop, also=agent.shutdown.set)
        jobs.start()
        loop.run()
        agent.shutdown.set()
        jobs.join()
        client.close()
        stats = agent.stats
        return (
            f"worker of {slug} stopped: {stats.claimed} claimed, {stats.succeeded} succeeded, "
            f"{stats.failed} failed, {stats.refused} refused, {stats.lost} lost"
        )

    def _install_signals(self, worker: Worker, also=None) -> None:
        def on_signal(signum, frame):
            if worker.stopping:
                # Asked twice: leave now. Unsettled messages come back by themselves.
                os._exit(1)
            # Only set the flags: the loops do the rest (and the logging) outside the handler.
            worker.stop()
            if also is not None:
                also()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)


def release_machine_lock() -> None:
    """Let go of the lock the local provider handed us: this machine counts as off now."""
    fd = os.environ.pop(LOCK_FD_ENV, None)
    if fd is None:
        return
    with contextlib.suppress(OSError, ValueError):
        os.close(int(fd))
