"""The run-lease heartbeat: keeps the runs this process holds from being claimed elsewhere.

A worker that claimed a run holds it until ``lease_expires_at``; while the handler runs,
this keeper extends the leases of every run the process holds, in one UPDATE per beat,
every ``heartbeat_interval`` (a third of the lease unless configured). A dead or stuck
process stops beating: its leases expire and the next copy of each message takes the
run over.

It runs in its own thread, with its own database connection, so a slow database never
holds up the consume loop's I/O thread (RabbitMQ's connection heartbeats, SQS's
visibility extensions). The thread starts with the first lease and ends after a while
with none; it closes its connection after each beat, so an idle worker holds none.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

from lifecycle.failures import log_failure
from outbox.runs import Lease, RunLedger

logger = logging.getLogger("hubdommed.worker")

# With nothing held for this long, the thread ends (the next lease starts another).
IDLE_EXIT_SECONDS = 5.0
# The longest the thread sleeps at a time (it also wakes on each new lease).
MAX_SLEEP = 1.0


class LeaseKeeper:
    def __init__(self, ledger: RunLedger) -> None:
        self.ledger = ledger
        self.beats = 0
        self._held: dict[str, tuple[Lease, float]] = {}  # holder -> (lease, next beat)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease) -> None:
        with self._lock:
            self._held[lease.holder] = (lease, time.monotonic() + lease.interval)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
                self._thread.start()
        self._wake.set()

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.holder, None)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def _run(self) -> None:
        idle_since: float | None = None
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                with self._lock:
                    if not self._held:
                        idle_since = idle_since or now
                        if now - idle_since >= IDLE_EXIT_SECONDS:
                            self._thread = None
                            return
                    else:
                        idle_since = None
                    due = [lease for lease, at in self._held.values() if at <= now]
                if due:
                    self._beat(due)
                with self._lock:
                    for lease in due:
                        if lease.holder in self._held:
                            self._held[lease.holder] = (lease, now + lease.interval)
                    soonest = min((at for _, at in self._held.values()), default=now + MAX_SLEEP)
                self._wake.wait(min(MAX_SLEEP, max(0.0, soonest - time.monotonic())))
        finally:
            connection.close()

    def _beat(self, due: list[Lease]) -> None:
        try:
            kept = self.ledger.extend(due)
        except Exception as exc:
            # The database is away: the leases run on; the next beat tries again.
            log_failure(logger, exc, "extending %d run leases failed", len(due))
        else:
            self.beats += 1
            with self._lock:
                lost = [
                    lease.run_id
                    for lease in due
                    if lease.holder not in kept and lease.holder in self._held
                ]
            if lost:
                # Expired and taken by another worker (this one was stuck or cut off
                # from the database longer than a lease): both may be running it.
                logger.warning("run leases lost while running: %s", ", ".join(lost))
        finally:
            connection.close()
