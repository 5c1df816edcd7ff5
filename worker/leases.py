"""The run-lease heartbeat: keeps the runs this process holds from being claimed elsewhere.

A worker that claimed a run holds it until ``lease_expires_at``; this keeper extends the
leases of every run the process holds, in one UPDATE per beat, from a thread with its own
database connection (a slow database never holds up the consume loop's I/O thread). A
dead or stuck process stops beating: its leases expire and the next copy of each message
takes the run over. Two kinds of lease:

- **A run a slot started** is held under the full lease (the queue's visibility timeout),
  extended every ``heartbeat_interval`` (a third of it unless configured): a handler
  outlives a database away, or its process stalled, for that long.
- **A run claimed ahead** (in the window, not started yet), where the broker gives a dead
  worker's messages back at once (RabbitMQ), is held under a short lease
  (``AHEAD_LEASE_SECONDS``) extended every ``AHEAD_BEAT_SECONDS``: it belongs to this
  process only while the process lives, so a crashed worker's unstarted runs are free
  seconds after its last beat, not a full lease later. Where the broker keeps a dead
  worker's messages until their visibility ends (SQS), nothing would come sooner to take
  such a run: it is held under the full lease from the claim.

A slot starts a run claimed ahead (``start``) only while its short lease is known to hold
``START_MARGIN`` seconds more (or half the lease, if shorter): the claim or the last beat
that kept it began recently enough. Then nothing is written: the keeper's next beat, at
most ``AHEAD_BEAT_SECONDS`` later, extends it by the full lease. Otherwise (no beat kept it
lately: the database slow or away, the process stalled) the slot confirms it itself first
(one statement), or does not run it.

The thread starts with the first lease and ends after a while with none, or when the
worker stops (``close``); it closes its connection after each beat, so an idle worker
holds none.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import connection

from lifecycle.failures import log_failure
from outbox.runs import Lease, RunLedger

logger = logging.getLogger("hubdommed.worker")

# With nothing held for this long, the thread ends (the next lease starts another).
IDLE_EXIT_SECONDS = 5.0
# The longest the thread sleeps at a time (it also wakes on its first lease).
MAX_SLEEP = 1.0
# A run claimed ahead of its slot: held this long past each beat (at most the full lease),
# beaten this often (at most the full lease's interval).
AHEAD_LEASE_SECONDS = 5.0
AHEAD_BEAT_SECONDS = 1.0
# A slot starts a run claimed ahead only while its lease holds for at least this long (or
# half the lease, if shorter): the keeper's next beat has that long to make it the full one.
START_MARGIN = 2.0


class Start(enum.Enum):
    # Held, from now on under the full lease (from the keeper's next beat).
    STARTED = "started"
    # Held, but no beat confirmed it lately: the slot confirms it itself, or does not run it.
    UNCONFIRMED = "unconfirmed"
    # Not held any more (given back meanwhile, at shutdown): not to be run.
    NOT_HELD = "not-held"


@dataclass(eq=False)
class _Held:
    lease: Lease
    # Claimed ahead, not started: under the short lease.
    ahead: bool
    # When (monotonic) the last statement that set its lease began: it holds from then
    # for as long as that statement granted.
    confirmed_at: float
    next_beat: float
    # Its outcome is being recorded: a beat that finds it settled has lost nothing.
    settling: bool = False


def ahead_seconds(lease: Lease) -> float:
    """The short lease of a run claimed ahead (never longer than its full lease)."""
    return min(AHEAD_LEASE_SECONDS, lease.seconds)


def _ahead_interval(lease: Lease) -> float:
    return min(AHEAD_BEAT_SECONDS, lease.interval)


class LeaseKeeper:
    def __init__(self, ledger: RunLedger) -> None:
        self.ledger = ledger
        self.beats = 0
        self._held: dict[str, _Held] = {}  # by holder
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # The worker stopped: the thread ends, and none starts again.
        self._closed = False

    def hold_many(self, leases: Sequence[Lease], *, ahead: bool, confirmed_at: float) -> None:
        """Keep these leases, set by a statement that began at ``confirmed_at``: under the
        short lease of a run claimed ahead (``ahead``), or the full one."""
        with self._lock:
            for lease in leases:
                interval = _ahead_interval(lease) if ahead else lease.interval
                self._held[lease.holder] = _Held(
                    lease, ahead, confirmed_at, confirmed_at + interval
                )
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="leases", daemon=True)
                self._thread.start()
                # Only the first lease wakes it: it beats on its own schedule after that
                # (at most ``MAX_SLEEP`` apart), not once per claim.
                self._wake.set()

    def hold(self, lease: Lease, *, ahead: bool = False, confirmed_at: float | None = None):
        """One lease (``hold_many``), set by a statement that began at ``confirmed_at``
        (default: now)."""
        began = time.monotonic() if confirmed_at is None else confirmed_at
        self.hold_many([lease], ahead=ahead, confirmed_at=began)

    def start(self, lease: Lease, *, confirmed_at: float | None = None) -> Start:
        """A slot is about to run ``lease``'s run: from now on it is kept under its full
        lease. ``confirmed_at``: the slot's own statement just extended it (it began then)."""
        now = time.monotonic()
        with self._lock:
            held = self._held.get(lease.holder)
            if held is None:
                return Start.NOT_HELD
            if not held.ahead:
                return Start.STARTED
            if confirmed_at is not None:
                held.confirmed_at = confirmed_at
                granted = lease.seconds
            else:
                granted = ahead_seconds(lease)
            margin = min(START_MARGIN, granted / 2)
            if held.confirmed_at + granted - now < margin:
                return Start.UNCONFIRMED
            held.ahead = False
            # Extended by the full lease at the keeper's next beat.
            held.next_beat = now
            return Start.STARTED

    def settling(self, lease: Lease) -> None:
        """The run's outcome is being recorded: still extended until dropped, but a beat
        that finds it settled meanwhile has lost nothing."""
        with self._lock:
            held = self._held.get(lease.holder)
            if held is not None:
                held.settling = True

    def drop(self, lease: Lease) -> None:
        with self._lock:
            self._held.pop(lease.holder, None)

    def drop_many(self, leases: Sequence[Lease]) -> None:
        with self._lock:
            for lease in leases:
                self._held.pop(lease.holder, None)

    @property
    def held(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """The worker stopped (its runs were given back or settled): the thread ends now,
        after the beat it may be in, not after ``IDLE_EXIT_SECONDS``."""
        with self._lock:
            self._closed = True
        self._wake.set()

    def _run(self) -> None:
        idle_since: float | None = None
        try:
            while True:
                self._wake.clear()
                now = time.monotonic()
                with self._lock:
                    if self._closed:
                        self._thread = None
                        return
                    if not self._held:
                        idle_since = idle_since or now
                        if now - idle_since >= IDLE_EXIT_SECONDS:
                            self._thread = None
                            return
                    else:
                        idle_since = None
                    due = [held for held in self._held.values() if held.next_beat <= now]
                    # What each beat grants: decided now, so that a run started while the
                    # statement runs is granted its full lease only at the next one.
                    grants = [
                        ahead_seconds(held.lease) if held.ahead else held.lease.seconds
                        for held in due
                    ]
                    intervals = [
                        _ahead_interval(held.lease) if held.ahead else held.lease.interval
                        for held in due
                    ]
                if due:
                    kept = self._beat([held.lease for held in due], grants)
                    with self._lock:
                        for held, interval in zip(due, intervals, strict=True):
                            if self._held.get(held.lease.holder) is not held:
                                continue  # dropped meanwhile
                            if held.lease.holder in kept:
                                held.confirmed_at = max(held.confirmed_at, now)
                            if held.next_beat <= now:
                                held.next_beat = now + interval
                with self._lock:
                    soonest = min(
                        (held.next_beat for held in self._held.values()), default=now + MAX_SLEEP
                    )
                self._wake.wait(min(MAX_SLEEP, max(0.0, soonest - time.monotonic())))
        finally:
            connection.close()

    def _beat(self, leases: list[Lease], grants: list[float]) -> set[str]:
        """Extend these leases; returns the holders whose lease it extended."""
        kept: set[str] = set()
        try:
            kept = self.ledger.extend(leases, grants)
        except Exception as exc:
            # The database is away: the leases run on; the next beat tries again.
            log_failure(logger, exc, "extending %d run leases failed", len(leases))
        else:
            self.beats += 1
            with self._lock:
                lost = [
                    lease.run_id
                    for lease in leases
                    if lease.holder not in kept
                    and (held := self._held.get(lease.holder)) is not None
                    and not held.ahead
                    and not held.settling
                ]
            if lost:
                # Expired and taken by another worker (this one was stuck or cut off
                # from the database longer than a lease): both may be running it.
                logger.warning("run leases lost while running: %s", ", ".join(lost))
        finally:
            connection.close()
        return kept
