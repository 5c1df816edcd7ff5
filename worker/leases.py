"""The run-lease heartbeat: keeps the runs this process holds from being claimed elsewhere.

A worker that claimed a run holds it until ``lease_expires_at``; this keeper extends the
leases of every run the process holds, in one UPDATE per beat. Two kinds of lease:

- a run claimed ahead (in the window, not started) is held under a short lease
  (``AHEAD_LEASE_SECONDS``), beaten every ``AHEAD_BEAT_SECONDS``: it belongs to this
  process only while the process lives, and a crashed worker's runs are free seconds
  after its last beat;
- a run a slot started is held under the full lease (the queue's visibility timeout),
  beaten every ``heartbeat_interval`` (a third of it unless configured): a handler
  survives a database away, or a process stalled, for that long.

A slot starts a run only while its short lease is known to hold for ``START_MARGIN``
seconds more, or half the lease if that is shorter (``start``: the keeper's last beat
that kept it, or the claim, is recent); otherwise the slot confirms it itself first (one
statement). The keeper extends the
started run by the full lease at its next beat, at most ``AHEAD_BEAT_SECONDS`` later. A
dead or stuck process stops beating: its leases expire and the next copy of each message
takes the run over.

It runs in its own thread, with its own database connection, so a slow database never
holds up the consume loop's I/O thread (RabbitMQ's connection heartbeats, SQS's
visibility extensions). The thread starts with the first lease and ends after a while
with none; it closes its connection after each beat, so an idle worker holds none.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace

from django.db import connection

from lifecycle.failures import log_failure
from outbox.runs import Lease, RunLedger

logger = logging.getLogger("hubdommed.worker")

# With nothing held for this long, the thread ends (the next lease starts another).
IDLE_EXIT_SECONDS = 5.0
# The longest the thread sleeps at a time (it also wakes on each new lease).
MAX_SLEEP = 1.0
# A run claimed ahead of its slot: held this long past each beat (at most the full lease),
# beaten this often (at most the full lease's interval).
AHEAD_LEASE_SECONDS = 5.0
AHEAD_BEAT_SECONDS = 1.0
# A slot starts a run claimed ahead only while its lease holds for at least this long (or
# half the lease, if shorter).
START_MARGIN = 2.0


def ahead_of(lease: Lease) -> Lease:
    """The short lease a run claimed ahead is held under, before its slot starts it."""
    return replace(
        lease,
        seconds=min(AHEAD_LEASE_SECONDS, lease.seconds),
        interval=min(AHEAD_BEAT_SECONDS, lease.interval),
    )


class LeaseKeeper:
    def __init__(self, ledger: RunLedger) -> None:
        self.ledger = ledger
        self.beats = 0
        self._held: dict[str, tuple[Lease, float]] = {}  # holder -> (lease, next beat)
        # holder -> when (monotonic) the last statement that set its lease began: the lease
        # holds at least its ``seconds`` from then.
        self._confirmed: dict[str, float] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    def hold(self, lease: Lease, *, confirmed_at: float) -> None:
        """Keep ``lease``, set by a statement that began at ``confirmed_at``."""
        with self._lock:
            self._held[lease.holder] = (lease, time.monotonic() + lease.interval)
            self._confirmed[lease.holder] = confirmed_at
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
                self._thread.start()
        self._wake.set()

    def start(self, running: Lease, *, confirmed_at: float | None = None) -> bool:
        """A slot starts the run held under a short lease: from now on it is kept under
        ``running`` (the full lease, from the next beat on). False, changing nothing, when
        the short lease may not hold ``START_MARGIN`` more seconds (no beat kept it
        lately): the slot confirms it itself, then calls again with ``confirmed_at``."""
        now = time.monotonic()
        with self._lock:
            entry = self._held.get(running.holder)
            if entry is None:
                return False
            held, next_beat = entry
            if confirmed_at is not None:
                self._confirmed[running.holder] = confirmed_at
                held = running
            confirmed = self._confirmed.get(running.holder)
            margin = min(START_MARGIN, held.seconds / 2)
            if confirmed is None or confirmed + held.seconds - now < margin:
                return False
            self._held[running.holder] = (running, next_beat)
            return True

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.holder, None)
            self._confirmed.pop(lease.holder, None)

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
                kept = self._beat(due) if due else set()
                with self._lock:
                    for lease in due:
                        entry = self._held.get(lease.holder)
                        if entry is None:
                            continue
                        if lease.holder in kept:
                            self._confirmed[lease.holder] = now
                        if entry[0] is lease:
                            self._held[lease.holder] = (lease, now + lease.interval)
                        else:
                            # Started meanwhile: extended by its full lease right away.
                            self._held[lease.holder] = (entry[0], now)
                    soonest = min((at for _, at in self._held.values()), default=now + MAX_SLEEP)
                self._wake.wait(min(MAX_SLEEP, max(0.0, soonest - time.monotonic())))
        finally:
            connection.close()

    def _beat(self, due: list[Lease]) -> set[str]:
        """Extend these leases; returns the holders whose lease it extended."""
        kept: set[str] = set()
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
        return kept
