"""The skeleton of a polling daemon, written once; each daemon plugs its cycle into it.

``run_scheduler``, ``watch_stuck_jobs`` and ``run_relay`` subclass ``Daemon`` and write
only what one cycle does (``cycle()``, made of step methods that tests call directly).
The base gives each of them, the same way:

- the stop flag (``self.stop``): SIGTERM and SIGINT only set it, and so does a stop asked
  for while the process was still starting (``lifecycle.startup``); the cycle under way
  finishes, no other starts, and ``handle`` returns, so the process exits 0;
- ``--once`` (one cycle, then exit) and ``--interval`` (seconds from the start of one
  cycle to the start of the next, refused unless positive; default: a setting);
- a correlation id of each cycle's own, bound around it: what the cycle logs and the
  messages it causes carry it, never one the process kept from its first cycle on;
- the dead-connection guard: a connection the database dropped while the daemon waited
  (a restart, a terminated backend, an idle timeout) is replaced before the cycle, not
  found dead by it, and a database error drops the connection at once, costing one
  warning and no traceback;
- a bug in a cycle is logged and the next cycle runs anyway;
- the heartbeat after each cycle, whatever the cycle met (an outage is not a hang);
- the summary ``handle`` returns (Django prints it).

Django's command and connection, nothing of the project: the project's log context is
given by ``common.daemon.Daemon``, which the daemons subclass, and each daemon's heartbeat
by the daemon (``heartbeat``), since this package stands below them.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import InterfaceError, OperationalError, close_old_connections, connection

from lifecycle import Stop
from lifecycle.startup import bounded_stop, stopped_during_startup
from lifecycle.values import number_option

DATABASE_ERRORS = (OperationalError, InterfaceError)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Beat(Protocol):
    def beat(self) -> None: ...


class Daemon(BaseCommand):
    # No system checks at each start: they check the models, the admin and the URLs, which
    # a daemon does not serve, and which a deploy checks once (``migrate``, ``manage.py
    # check --deploy``); they loaded the URLconf and every admin module in every daemon.
    requires_system_checks: list[str] = []
    # The daemon's name in its log lines.
    name = "daemon"
    # The setting that holds the default ``--interval``.
    interval_setting = ""
    # Binds ids to the log lines of a block: the project's ``common.context.log_context``.
    log_context: Callable[..., AbstractContextManager] = staticmethod(lambda **ids: nullcontext())

    # The daemon's sign of life, beaten after each cycle: a ``common.metrics.Heartbeat``.
    heartbeat: Beat

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stop = Stop()
        self.cycles = 0
        self._interval: float | None = None

    @property
    def logger(self) -> logging.Logger:
        """The logger its lines go to, ``hubdommed.<name>``: its module's lines go there too."""
        return logging.getLogger(f"hubdommed.{self.name}")

    @property
    def shutdown(self) -> bool:
        return self.stop.requested

    @property
    def interval(self) -> float:
        """Seconds between the starts of two cycles: ``--interval``, or the setting."""
        if self._interval is None:
            return getattr(settings, self.interval_setting)
        return self._interval

    @interval.setter
    def interval(self, value: float) -> None:
        self._interval = value

    def add_arguments(self, parser) -> None:
        parser.add_argument("--once", action="store_true", help="run one cycle, then exit")
        parser.add_argument(
            "--interval",
            type=number_option(minimum=0.01),
            default=None,
            help=f"seconds between cycles (default: {self.interval_setting})",
        )

    # -- what a daemon writes ------------------------------------------------------------------

    def cycle(self) -> Any:
        """One cycle's work; what it returns, ``run_cycle`` returns."""
        raise NotImplementedError

    def starting(self) -> None:
        """Before the first cycle: say what the daemon will do, open what it needs. A
        ``CommandError`` here refuses to start."""

    def finished(self) -> None:
        """After the last cycle, whatever ended the loop: close what ``starting`` opened."""

    def summary(self) -> str:
        return f"{self.name} stopped after {self.cycles} cycles"

    def database_away(self, exc: Exception) -> None:
        """The database did not answer (or dropped this connection): one line, no
        traceback, and the next cycle starts on a new connection."""
        self.logger.warning("%s: database unreachable (%s)", self.name, exc)
        self.drop_connection()

    def cycle_failed(self) -> None:
        """A bug: logged, and the next cycle tries again."""
        self.logger.exception("%s cycle failed", self.name)

    def pause(self, started: float) -> None:
        """Wait for the next cycle (``started``: this one's start, monotonic); a stop
        ends the wait within a slice."""
        self.stop.sleep_until(started + self.interval)

    # -- the skeleton --------------------------------------------------------------------------

    def guard_connection(self) -> None:
        """Replace a connection the database dropped before using it. Not inside a caller's
        transaction (a test, a shell): that connection is the caller's."""
        if not connection.in_atomic_block:
            close_old_connections()

    @staticmethod
    def drop_connection() -> None:
        try:
            connection.close()
        except Exception:  # already broken: nothing left to save
            logging.getLogger("hubdommed").debug("closing the connection failed", exc_info=True)

    def run_cycle(self) -> Any:
        """One cycle with its guard, its own correlation id and the heartbeat after it."""
        self.guard_connection()
        result = None
        with self.log_context(correlation_id=str(uuid.uuid4())):
            try:
                result = self.cycle()
            except DATABASE_ERRORS as exc:
                self.database_away(exc)
            except Exception:
                self.cycle_failed()
        self.cycles += 1
        self.heartbeat.beat()
        return result

    def run_once(self) -> None:
        self.run_cycle()

    def run_forever(self) -> None:
        while not self.shutdown:
            started = time.monotonic()
            self.run_cycle()
            if self.shutdown:
                break
            self.pause(started)

    def handle(self, *args: Any, once: bool = False, interval: float | None = None, **options):
        # First of all: from here on a signal only sets the flag, and one that came while
        # the process was starting is honoured now. Only the main thread may install
        # handlers; a daemon run on another (a test) is stopped with ``stop.set()``.
        if threading.current_thread() is not threading.main_thread():
            return self.stop_line(self._handle(once=once, interval=interval))
        previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
        self.stop.install()
        try:
            with bounded_stop(self.stop, settings.DAEMON_STOP_SECONDS, self._stuck):
                return self.stop_line(self._handle(once=once, interval=interval))
        finally:
            # The handlers of before (under ``manage.py``, the start-up ones, which only
            # record a stop: the exit that follows stays clean; under a test, pytest's).
            for signum, handler in previous.items():
                signal.signal(signum, handler)

    def _stuck(self, where: str) -> None:
        self.logger.error("%s: %s (DAEMON_STOP_SECONDS)", self.name, where)

    def stop_line(self, summary: str) -> str:
        """The summary, for Django to print; with ``LOG_FORMAT=json`` a log record instead
        (nothing printed), so that every line the process writes is JSON."""
        if getattr(settings, "LOG_FORMAT", "text") == "json":
            self.logger.info(summary)
            return ""
        return summary

    def _handle(self, *, once: bool, interval: float | None) -> str:
        if stopped_during_startup():
            self.stop.set()
        if interval is not None:
            if interval <= 0:
                raise CommandError("--interval must be a positive number of seconds")
            self.interval = interval
        if self.shutdown:
            return self.summary()
        self.starting()
        try:
            if once:
                self.run_once()
            else:
                self.run_forever()
        finally:
            self.finished()
        return self.summary()
