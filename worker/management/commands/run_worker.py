"""``manage.py run_worker``: run background tasks, or an automation's jobs, until told to stop.

Two roles over one consume loop (``broker.consume_loop``), wired by ``worker.builders``:

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
import fcntl
import logging
import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections

from automation.agent.client import AutomationInfo, HubClient, HubError
from automation.machines.local import LOCK_FD_ENV, machines_dir
from broker.consume_loop import ConsumeLoop
from broker.topology import QUEUES
from common.logs import flush_now
from common.metrics import serve_metrics
from lifecycle import Backoff, Stop
from lifecycle.startup import bounded_stop, stopped_during_startup
from lifecycle.values import number_option
from worker.builders import build_automation_worker, build_task_worker

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


def _leave_now() -> None:
    flush_now()
    os._exit(1)


# Past its budget, a stop waits this much more for the worker's own ending (its hand-back
# of what did not finish) before it is ended where it is blocked.
STOP_MARGIN_SECONDS = 5.0


def _stuck(where: str) -> None:
    logger.error("worker: %s (WORKER_STOP_BUDGET + %g s)", where, STOP_MARGIN_SECONDS)
    flush_now()


class Command(BaseCommand):
    help = "Run background tasks from the given queues (default: QUEUES)."
    # No system checks at each start, as for the other daemons (lifecycle.daemon.Daemon).
    requires_system_checks: list[str] = []

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Set by SIGTERM or SIGINT from the start of ``handle`` on, before anything slow
        # (the handlers' imports, the broker, the hub); the consume loop's own stop
        # follows it once the loop is built.
        self.stop = Stop()

    def add_arguments(self, parser):
        parser.add_argument(
            "--queues",
            default=None,
            help="comma-separated queue classes, in order of priority (default: QUEUES)",
        )
        parser.add_argument(
            "--automation",
            metavar="SLUG",
            help="run this automation's jobs (the worker of its machine) instead of tasks",
        )
        parser.add_argument(
            "--poll-interval",
            type=number_option(minimum=0.05),
            default=None,
            help="with --automation: seconds between polls of the hub "
            "(default: AGENT_POLL_INTERVAL)",
        )
        parser.add_argument(
            "--idle-timeout",
            type=number_option(minimum=0),
            default=None,
            help="with --automation: exit after this many idle seconds, 0 never "
            "(default: AGENT_IDLE_TIMEOUT)",
        )
        parser.add_argument(
            "--concurrency",
            type=number_option(whole=True, minimum=1, maximum=1000),
            default=None,
            help="tasks in flight at once in this process (default: WORKER_CONCURRENCY)",
        )

    def handle(
        self,
        *args,
        queues: str | None,
        concurrency: int | None,
        automation: str | None,
        **options,
    ):
        # An option that does not apply to the kind of worker asked for is refused, not
        # ignored: the worker would run without what its operator meant.
        poll_interval, idle_timeout = options["poll_interval"], options["idle_timeout"]
        if automation:
            given = {"--queues": queues, "--concurrency": concurrency}
        else:
            given = {"--poll-interval": poll_interval, "--idle-timeout": idle_timeout}
        foreign = [name for name, value in given.items() if value is not None]
        if foreign:
            raise CommandError(
                f"{' and '.join(foreign)} {'apply' if len(foreign) > 1 else 'applies'} only "
                + ("without --automation" if automation else "with --automation")
            )
        # Asked twice: leave now (the lines written so far first). Unsettled messages come
        # back by themselves.
        self.stop.install(twice=_leave_now)
        if stopped_during_startup():
            self.stop.set()
        if automation:
            if poll_interval is None:
                poll_interval = settings.AGENT_POLL_INTERVAL
            if idle_timeout is None:
                idle_timeout = settings.AGENT_IDLE_TIMEOUT
            return self.run_automation_worker(
                automation, poll_interval=poll_interval, idle_timeout=idle_timeout or None
            )
        if queues is None:
            queues = ",".join(settings.QUEUES)
        if concurrency is None:
            concurrency = settings.WORKER_CONCURRENCY
        destinations = parse_queues(queues)
        if concurrency < 1:
            raise CommandError("--concurrency must be at least 1")
        if self.stop.requested:
            self._exit_now("worker stopped before it started")
        # The hub's background worker only: an automation's worker runs on its machine,
        # beside others the local provider starts with the same environment.
        serve_metrics("worker")
        worker = build_task_worker(
            destinations,
            concurrency=concurrency,
            stop_budget=settings.WORKER_STOP_BUDGET,
            ready_file=settings.WORKER_READY_FILE or None,
        )
        self._follow_stop(worker.loop)
        # Past its budget and a margin the stop is over, whatever holds the process (a
        # broker or database that hung mid-answer).
        with bounded_stop(self.stop, settings.WORKER_STOP_BUDGET + STOP_MARGIN_SECONDS, _stuck):
            summary = worker.summary(worker.run())
        self._exit_now(summary)

    def _exit_now(self, summary: str) -> None:
        """The stop is done within its budget: what did not finish was given back, and
        handler threads still stuck are only left to die. Leave now, without the
        interpreter's teardown of a process this size, which alone may take seconds on a
        busy machine and would push the exit past the budget an orchestrator allows."""
        if settings.LOG_FORMAT == "json":
            # Every line the process writes is JSON: the summary is a record too.
            logger.info(summary)
        else:
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
        if self.stop.requested:
            return f"worker of {slug} stopped before it started"
        client = HubClient(settings.HUB_URL, credential)
        info = self._wait_for_hub(client)
        if info is None:
            client.close()
            return f"worker of {slug} stopped before the hub answered"
        if info.slug != slug:
            raise CommandError(f"this credential belongs to automation {info.slug!r}, not {slug!r}")
        runtime = build_automation_worker(
            client,
            info,
            poll_interval=poll_interval,
            idle_timeout=idle_timeout,
            outcomes_dir=outcomes_dir(slug),
            ready_file=settings.WORKER_READY_FILE or None,
        )
        self._follow_stop(runtime.loop)
        lock = MachineLock(slug)
        return runtime.run(release_machine=lock.release, reclaim_machine=lock.reclaim)

    def _wait_for_hub(self, client: HubClient) -> AutomationInfo | None:
        """Who this worker is, asked of the hub; a hub that does not answer yet (starting,
        restarting) is waited for, a refusal (a credential that does not work) is final.
        None: stopped before the hub answered (a clean exit, like any other stop)."""
        stop = self.stop
        backoff = Backoff(0.5, settings.AGENT_REPORT_BACKOFF_MAX, jitter=True)
        while True:
            try:
                return client.me()
            except HubError as exc:
                if not exc.retryable:
                    raise CommandError(f"the hub at {settings.HUB_URL} refused: {exc}") from exc
                pause = backoff.failed()
                logger.warning(
                    "the hub at %s does not answer yet, trying again in %.1f s: %s",
                    settings.HUB_URL,
                    pause,
                    exc,
                )
                if stop.wait(pause):
                    return None

    def _follow_stop(self, loop: ConsumeLoop) -> None:
        """The loop stops with the command: at once when the stop came while it was built."""
        self.stop.on_stop(loop.stop)
        if self.stop.requested:
            loop.stop()


class MachineLock:
    """The lock the local provider handed this worker (``LOCK_FD_ENV``): held, the machine
    is on and no power-on starts another worker; let go when idle, the machine counts as
    off. A worker started without one (an EC2 machine, by hand) has nothing to contend for.
    """

    def __init__(self, slug: str) -> None:
        handed = os.environ.pop(LOCK_FD_ENV, None)
        self._fd: int | None = None
        self._path: Path | None = None
        if handed is not None:
            with contextlib.suppress(ValueError):
                self._fd = int(handed)
            self._path = machines_dir() / f"{slug}.lock"

    def release(self) -> None:
        """Let go of the lock: this machine counts as off now."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def reclaim(self) -> bool:
        """Take the lock back, unless a power-on took it for a new worker meanwhile (False:
        the machine is that worker's)."""
        if self._path is None or self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True


def outcomes_dir(slug: str) -> Path:
    """Where this machine keeps the outcomes its workers have not reported yet."""
    return Path(settings.AGENT_STATE_DIR or settings.LOCAL_MACHINES_DIR) / f"{slug}.outcomes"
