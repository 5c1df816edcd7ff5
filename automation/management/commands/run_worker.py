"""``manage.py run_worker``: run background tasks from the queues, until told to stop.

Thin on purpose: it wires the worker runtime (``outbox.runtime``) to the configured
broker and to the task handlers found in each app's ``tasks.py``. How retries, dead
letters, heartbeats and SIGTERM work is in docs/worker.md.
"""

from __future__ import annotations

import logging
import os
import signal

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from outbox.catalog import get_catalog
from outbox.models import QUEUES
from outbox.runtime.loop import Worker
from outbox.runtime.processor import TaskProcessor
from outbox.runtime.registry import discover_handlers
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
            "--concurrency",
            type=int,
            default=settings.WORKER_CONCURRENCY,
            help="tasks in flight at once in this process (default: WORKER_CONCURRENCY)",
        )

    def handle(self, *args, queues: str, concurrency: int, **options) -> str:
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
        return f"worker stopped: {stats.received} received, {stats.given_back} given back" + (
            f", {outcomes}" if outcomes else ""
        )

    def _install_signals(self, worker: Worker) -> None:
        def on_signal(signum, frame):
            if worker.stopping:
                # Asked twice: leave now. Unsettled messages come back by themselves.
                os._exit(1)
            # Only set the flag: the loop does the rest (and the logging) outside the handler.
            worker.stop()

        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, on_signal)
