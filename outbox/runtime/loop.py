"""The consume loop: slots, heartbeats, readiness and a clean stop. No database here.

One thread (the caller of ``run``) owns the broker connection: it polls for deliveries,
hands them to ``concurrency`` worker threads, extends the visibility of what is in
flight (SQS) and, on RabbitMQ, keeps the connection's heartbeats flowing however long
the tasks take. What a delivery means is the ``Processor``'s business: the task runtime
(``outbox.runtime.processor``) or an automation's own worker.

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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from relay.transports.base import TransportUnavailable
from relay.transports.consume import Consumer, Delivery

logger = logging.getLogger("hubdommed.worker")

# Waiting between reconnection attempts while the broker is unreachable. Capped low: the
# time from the broker's return to consuming again must not grow with the outage.
RECONNECT_FIRST = 0.5
RECONNECT_MAX = 5.0
# Of the stop budget, what is kept for giving back unfinished work and closing.
STOP_RESERVE_SHARE = 0.1
STOP_RESERVE_MAX = 1.0


class Processor(Protocol):
    def process(self, delivery: Delivery) -> None:
        """Handle one delivery and settle it (under ``delivery.settling()``)."""

    def released(self, delivery: Delivery) -> None:
        """A delivery whose processing had started was given back at shutdown."""

    def thread_done(self) -> None:
        """A worker thread is about to end (release what it holds: a database connection)."""


@dataclass
class _InFlight:
    delivery: Delivery
    started: bool = False
    next_beat: float | None = None


@dataclass
class LoopStats:
    received: int = 0
    given_back: int = 0
    reconnects: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)


class Worker:
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
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.consumer = consumer
        self.destinations = list(destinations)
        self.processor = processor
        self.concurrency = concurrency
        self.stop_budget = stop_budget
        self.ready_file = Path(ready_file) if ready_file else None
        self.poll_interval = poll_interval
        self.stats = LoopStats()
        self._stopping = threading.Event()
        # When the stop must be over (monotonic), set by the first ``stop()``.
        self._stop_deadline: float | None = None
        self._ready = threading.Event()
        self._work: queue.Queue[Delivery] = queue.Queue()
        self._in_flight: dict[int, _InFlight] = {}
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- control (any thread, signal handlers included) ------------------------------------

    def stop(self) -> None:
        if self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.stop_budget
        self._stopping.set()

    def _remaining(self) -> float:
        """Seconds left before the stop deadline (the whole budget before a stop)."""
        if self._stop_deadline is None:
            return self.stop_budget
        return max(0.0, self._stop_deadline - time.monotonic())

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_until_ready(self, timeout: float) -> bool:
        return self._ready.wait(timeout)

    @property
    def in_flight(self) -> int:
        with self._lock:
            return len(self._in_flight)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> LoopStats:
        if not self._connect():
            return self.stats
        for number in range(self.concurrency):
            thread = threading.Thread(target=self._work_loop, name=f"task-{number}", daemon=True)
            thread.start()
            self._threads.append(thread)
        self._set_ready(True)
        logger.info(
            "worker consuming %s from %s with %d slots",
            ", ".join(self.destinations),
            self.consumer.name,
            self.concurrency,
        )
        try:
            while not self.stopping:
                self.step(self.poll_interval)
            self._drain()
            # Idle threads end within a moment; one stuck in a handler is left behind.
            # All of them share what is left of the deadline, not half a second each.
            for thread in self._threads:
                thread.join(timeout=min(0.5, self._remaining()))
        finally:
            self._set_ready(False)
            self.consumer.close()
        return self.stats

    def step(self, timeout: float) -> None:
        """One turn of the I/O thread: take deliveries, beat hearts."""
        try:
            deliveries = self.consumer.poll(timeout)
        except TransportUnavailable as exc:
            logger.warning("broker connection lost (%s); reconnecting", exc)
            self._set_ready(False)
            if self._connect():
                self._set_ready(True)
            return
        for delivery in deliveries:
            self._accept(delivery)
        self._heartbeat()

    def _connect(self) -> bool:
        delay = RECONNECT_FIRST
        while not self.stopping:
            try:
                self.consumer.start(self.destinations, self.concurrency)
                return True
            except TransportUnavailable as exc:
                self.stats.reconnects += 1
                logger.warning("broker unreachable (%s); retrying in %.1f s", exc, delay)
                self._stopping.wait(delay)
                delay = min(RECONNECT_MAX, delay * 2)
        return False

    def _accept(self, delivery: Delivery) -> None:
        self.stats.received += 1
        if self.stopping:
            self._give_back(delivery, started=False)
            return
        interval = self.consumer.heartbeat_interval(delivery)
        with self._lock:
            self._in_flight[id(delivery)] = _InFlight(
                delivery, next_beat=None if interval is None else time.monotonic() + interval
            )
        self._work.put(delivery)

    def _heartbeat(self) -> None:
        now = time.monotonic()
        with self._lock:
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
        while True:
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
                self._forget(delivery)

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
            if started:
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
