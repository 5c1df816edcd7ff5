"""The consume loop: slots, heartbeats, readiness and a clean stop. No database here.

One thread (the caller of ``run``) owns the broker connection: it polls for deliveries,
hands them to ``concurrency`` worker threads, extends the visibility of what is in
flight (SQS) and, on RabbitMQ, keeps the connection's heartbeats flowing however long
the tasks take. What a delivery means is the ``Processor``'s business: the task runtime
(``worker.processor``) or an automation's own worker.

The broker may hand over more messages than there are slots (``prefetch``), so that a
slot that finishes finds its next message waiting instead of waiting for a round trip.
A delivery stays in flight until it is settled, not only until its slot let go of it: a
processor may settle it later, together with others. A processor that prepares what it
receives in groups (``on_received``: the task runtime claims their runs together) hands
each delivery to the slots itself once it is ready to run (``hand_over``), and settles
the others without a slot; a slot never waits for that preparation. A slot stuck in a
handler past its time limit can be replaced (``replace_slot``): the stuck thread ends
when its handler returns, and a new one takes its place meanwhile.

Stopping (``stop()``, which a signal handler may call): fetch nothing more, remove the
readiness file, wait for the tasks in flight, then give back what did not finish (the
processor records it: the task runtime puts its run back to ``queued``) and return. The
whole stop, from ``stop()`` to ``run()`` returning, keeps to ONE deadline, the stop
budget: waiting for the tasks ends a moment before it so that giving back and closing
fit, and handler threads still stuck at the deadline are left behind (they are daemon
threads; their messages were given back).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from broker.base import TransportUnavailable
from broker.consume import Consumer, Delivery
from lifecycle import Backoff, Stop

logger = logging.getLogger("hubdommed.worker")

# Waiting between reconnection attempts while the broker is unreachable. Capped low: the
# time from the broker's return to consuming again must not grow with the outage.
RECONNECT_FIRST = 0.5
RECONNECT_MAX = 5.0
# Of the stop budget, what is kept for giving back unfinished work and closing.
STOP_RESERVE_SHARE = 0.1
STOP_RESERVE_MAX = 1.0
# How often deliveries settled apart from their slot are swept out of the count of what
# is in flight (every turn while stopping).
SWEEP_INTERVAL = 0.05


class Processor(Protocol):
    def process(self, delivery: Delivery) -> None:
        """Handle one delivery and settle it (under ``delivery.settling()``)."""

    def released(self, delivery: Delivery) -> None:
        """A delivery whose processing had started was given back at shutdown."""

    def thread_done(self) -> None:
        """A worker thread is about to end (release what it holds: a database connection)."""

    def stopped(self) -> None:
        """The loop is over: end the threads of the processor's own."""


@dataclass
class _InFlight:
    delivery: Delivery
    started: bool = False
    # Its slot is done with it (it may still wait to be settled with others).
    processed: bool = False
    next_beat: float | None = None


@dataclass
class LoopStats:
    received: int = 0
    given_back: int = 0
    reconnects: int = 0


class ConsumeLoop:
    def __init__(
        self,
        consumer: Consumer,
        destinations: Sequence[str],
        processor: Processor,
        *,
        concurrency: int,
        stop_budget: float,
        ready_file: str | Path | None = None,
        poll_interval: float = 0.2,
        prefetch: int | None = None,
        on_received: Callable[[list[Delivery]], None] | None = None,
        on_step: Callable[[], None] | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.consumer = consumer
        self.destinations = list(destinations)
        self.processor = processor
        self.concurrency = concurrency
        # Unsettled messages the broker may hand over at once (default: one per slot).
        self.prefetch = max(concurrency, prefetch or concurrency)
        # Told of each group of deliveries as they arrive (on this loop's thread: it must
        # not block); it hands them to the slots itself (``hand_over``).
        self._on_received = on_received
        # Called once per turn of the loop (a liveness heartbeat).
        self._on_step = on_step
        self.stop_budget = stop_budget
        self.ready_file = Path(ready_file) if ready_file else None
        self.poll_interval = poll_interval
        self.stats = LoopStats()
        # The stop flag (a signal handler may set it: ``install`` it); setting it starts
        # the stop budget's clock.
        self.stop_flag = Stop()
        self.stop_flag.on_stop(self._start_stop_clock)
        # When the stop must be over (monotonic), set by the first ``stop()``.
        self._stop_deadline: float | None = None
        self._ready = threading.Event()
        self._work: queue.SimpleQueue[Delivery] = queue.SimpleQueue()
        self._in_flight: dict[int, _InFlight] = {}
        # Whether any delivery in flight needs the consumer's heartbeat (SQS's visibility),
        # and when settled deliveries were last swept out of ``_in_flight``.
        self._beating = False
        self._swept_at = 0.0
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        # Slots replaced while stuck in a handler: they end when the handler returns.
        self._retired: set[threading.Thread] = set()
        # Outcomes the processor settles in groups, not acked yet (``unsettled``).
        self._unsettled: Callable[[], int] = getattr(processor, "unsettled", lambda: 0)

    # -- control (any thread, signal handlers included) ------------------------------------

    def stop(self) -> None:
        self.stop_flag.set()

    def _start_stop_clock(self) -> None:
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.stop_budget

    def _remaining(self) -> float:
        """Seconds left before the stop deadline (the whole budget before a stop)."""
        if self._stop_deadline is None:
            return self.stop_budget
        return max(0.0, self._stop_deadline - time.monotonic())

    @property
    def stopping(self) -> bool:
        return self.stop_flag.requested

    def wait_until_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def in_flight(self) -> int:
        """Deliveries not settled yet: held by a slot or waiting for one, or settled by
        their slot's processor in a group that is not committed and acked yet."""
        with self._lock:
            held = len(self._in_flight)
        return held + self._unsettled()

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> LoopStats:
        """Consume until stopped, then stop within the budget (``start``, ``step``s, ``finish``)."""
        if not self.start():
            return self.stats
        try:
            while not self.stopping:
                self.step(self.poll_interval)
        except BaseException:
            self._set_ready(False)
            self.consumer.close()
            self.processor.stopped()
            raise
        return self.finish()

    def start(self) -> bool:
        """Connect and start the slots' threads; False when stopped before the broker answered."""
        if not self._connect():
            return False
        for _ in range(self.concurrency):
            self._start_slot()
        self._set_ready(True)
        logger.info(
            "worker consuming %s from %s with %d slots",
            ", ".join(self.destinations),
            self.consumer.name,
            self.concurrency,
        )
        return True

    def _start_slot(self) -> threading.Thread:
        with self._lock:
            number = len(self._threads)
            thread = threading.Thread(target=self._work_loop, name=f"task-{number}", daemon=True)
            self._threads.append(thread)
        thread.start()
        return thread

    def replace_slot(self, thread: threading.Thread, delivery: Delivery) -> None:
        """``thread`` is stuck in a handler and its delivery was settled without it: a new
        slot takes its place now, and the stuck one ends as soon as its handler returns."""
        with self._lock:
            if thread in self._retired or thread not in self._threads:
                return
            self._retired.add(thread)
            self._in_flight.pop(id(delivery), None)
        if not self.stopping:
            self._start_slot()
        logger.warning("slot %s abandoned to a handler past its time limit; replaced", thread.name)

    def finish(self) -> LoopStats:
        """After ``stop``: give back what did not finish in time, close the connection."""
        try:
            self._drain()
            # Idle threads end within a moment; one stuck in a handler is left behind.
            # All of them share what is left of the deadline, not half a second each.
            with self._lock:
                threads = [t for t in self._threads if t not in self._retired]
            for thread in threads:
                thread.join(timeout=min(0.5, self._remaining()))
        finally:
            self._set_ready(False)
            self.consumer.close()
            self.processor.stopped()
        return self.stats

    def step(self, timeout: float) -> bool:
        """One turn of the I/O thread: take deliveries, beat hearts. True when deliveries
        came (more may be waiting right away)."""
        try:
            deliveries = self.consumer.poll(timeout)
        except TransportUnavailable as exc:
            logger.warning("broker connection lost (%s); reconnecting", exc)
            self._set_ready(False)
            if self._connect():
                self._set_ready(True)
            return False
        accepted = [delivery for delivery in deliveries if self._accept(delivery)]
        if self._on_received is not None:
            if accepted:
                self._on_received(accepted)
        else:
            for delivery in accepted:
                self._work.put(delivery)
        self._heartbeat()
        if self._on_step is not None:
            self._on_step()
        return bool(deliveries)

    def _connect(self) -> bool:
        backoff = Backoff(RECONNECT_FIRST, RECONNECT_MAX)
        while not self.stopping:
            try:
                self.consumer.start(self.destinations, self.prefetch)
                return True
            except TransportUnavailable as exc:
                self.stats.reconnects += 1
                delay = backoff.failed()
                logger.warning("broker unreachable (%s); retrying in %.1f s", exc, delay)
                self.stop_flag.wait(delay)
        return False

    def hand_over(self, delivery: Delivery) -> None:
        """A delivery the ``on_received`` processor prepared, for the next free slot."""
        self._work.put(delivery)

    def _accept(self, delivery: Delivery) -> bool:
        self.stats.received += 1
        if self.stopping:
            self._give_back(delivery, started=False)
            return False
        interval = self.consumer.heartbeat_interval(delivery)
        if interval is not None:
            self._beating = True
        with self._lock:
            self._in_flight[id(delivery)] = _InFlight(
                delivery, next_beat=None if interval is None else time.monotonic() + interval
            )
        return True

    def _heartbeat(self) -> None:
        now = time.monotonic()
        if not self._beating and now - self._swept_at < SWEEP_INTERVAL and not self.stopping:
            return
        self._swept_at = now
        with self._lock:
            # Settled after their slot let go of them (together with others), or settled
            # without a slot (by the processor that prepares them).
            for key in [
                key
                for key, entry in self._in_flight.items()
                if entry.delivery.settled and (entry.processed or not entry.started)
            ]:
                del self._in_flight[key]
            if not self._beating:
                return
            due = [
                entry
                for entry in self._in_flight.values()
                if entry.next_beat is not None and entry.next_beat <= now
            ]
        for entry in due:
            delivery = entry.delivery
            if delivery.settled:
                continue
            try:
                self.consumer.extend(delivery)
            except TransportUnavailable as exc:
                logger.warning("heartbeat for %s failed: %s", delivery.run_id, exc)
            interval = self.consumer.heartbeat_interval(delivery)
            entry.next_beat = None if interval is None else now + interval

    def _work_loop(self) -> None:
        try:
            self._take_work()
        finally:
            self.processor.thread_done()

    def _take_work(self) -> None:
        me = threading.current_thread()
        while me not in self._retired:
            try:
                delivery = self._work.get(timeout=0.2)
            except queue.Empty:
                if self.stopping:
                    return
                continue
            if self.stopping:
                # Not started yet: back to the queue at once, for another worker.
                self._give_back(delivery, started=False)
                self._forget(delivery)
                continue
            with self._lock:
                entry = self._in_flight.get(id(delivery))
                if entry is not None:
                    entry.started = True
            try:
                self.processor.process(delivery)
            except Exception:
                # A bug in the processor: the message is not lost, the broker brings it back.
                logger.exception("processing %s failed unexpectedly", delivery.run_id)
                self._give_back(delivery, started=True)
            finally:
                self._processed(delivery)

    def _processed(self, delivery: Delivery) -> None:
        """Its slot is done with it: forgotten now if settled, else once it is."""
        with self._lock:
            entry = self._in_flight.get(id(delivery))
            if entry is None:
                return
            if delivery.settled:
                del self._in_flight[id(delivery)]
            else:
                entry.processed = True

    def _forget(self, delivery: Delivery) -> None:
        with self._lock:
            self._in_flight.pop(id(delivery), None)

    def _drain(self) -> None:
        logger.info("worker stopping: no longer fetching")
        self._set_ready(False)
        self.consumer.stop_fetching()
        reserve = min(STOP_RESERVE_MAX, self.stop_budget * STOP_RESERVE_SHARE)
        deadline = time.monotonic() + max(0.0, self._remaining() - reserve)
        waiting = self.in_flight
        if waiting:
            logger.info(
                "worker stopping: waiting up to %.1f s for %d tasks",
                max(0.0, deadline - time.monotonic()),
                waiting,
            )
        # Outcomes a processor settles in groups are committed and acked meanwhile (they
        # count as in flight): the steps carry their acks.
        while self.in_flight and time.monotonic() < deadline:
            self.step(min(0.1, max(0.0, deadline - time.monotonic())))
        with self._lock:
            leftovers = list(self._in_flight.values())
        for entry in leftovers:
            self._give_back(entry.delivery, started=entry.started)
        # Let the I/O thread send what it was asked to (RabbitMQ nacks from other threads).
        self.step(0)
        if leftovers:
            logger.info("worker stopped: %d unfinished tasks given back", len(leftovers))

    def _give_back(self, delivery: Delivery, *, started: bool) -> None:
        with delivery.settling() as mine:
            if not mine:
                return
            self.stats.given_back += 1
            try:
                self.consumer.release(delivery)
            except TransportUnavailable as exc:
                # Its connection is gone: the broker takes it back by itself.
                logger.info("could not give back %s: %s", delivery.run_id, exc)
            # Not started by a slot, it may still have been prepared (its run claimed
            # ahead): the processor knows, and lets go of what it holds.
            if started or self._on_received is not None:
                try:
                    self.processor.released(delivery)
                except Exception:
                    logger.exception("recording the return of %s failed", delivery.run_id)

    # -- readiness -------------------------------------------------------------------------

    def _set_ready(self, ready: bool) -> None:
        if ready:
            self._ready.set()
        else:
            self._ready.clear()
        if self.ready_file is None:
            return
        try:
            if ready:
                self.ready_file.write_text(f"{os.getpid()}\n")
            else:
                self.ready_file.unlink(missing_ok=True)
        except OSError as exc:
            logger.warning("readiness file %s: %s", self.ready_file, exc)
