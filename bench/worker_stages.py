"""Where a message's time goes in the worker: the stages of its window, per message.

    LOG_LEVEL=warning DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_worker_bench \\
        .venv/bin/python bench/worker_stages.py --messages 3000 --rounds 2

The same no-op tasks and worker as ``bench/worker.py`` (``ours``), with a clock read at
each hand-over of a message, by wrappers around the window's methods (nothing in the
worker changes; the wrappers cost a few microseconds a message):

- ``received``: the consume loop took it from pika (the broker sent it);
- ``prepared``: handed to the window with the others of its poll;
- ``claim started`` / ``claimed``: the claiming thread's statement for its group;
- ``in a slot``: a slot took it; ``done``: its handler returned and its outcome waits;
- ``commit started`` / ``committed``: the group commit of the outcomes, then the ack.

Printed per round: the rate, the median and 90th percentile of each stage, and the size of
the groups claimed and committed together; the broker's turn (from a group's ``basic.ack``
handed to the I/O thread to the next delivery received: what RabbitMQ and pika take to
refill the window); and, where PostgreSQL runs on this machine, the CPU its backends spent
per statement (read from ``/proc`` for the claiming and the committing connections). Then
each statement alone, on one connection in one thread (the claim and the group commit of
groups of 16 and 64 runs): what a stage costs in PostgreSQL against what it costs inside
the worker.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import worker as bench  # sets Django up first
from bench.load import add_load_arguments, load_note, require_quiet
from broker.rabbitmq.consumer import RabbitMQConsumer
from outbox import runs
from worker.processor import TaskProcessor
from worker.window import RunWindow

STAGES = (
    "received",
    "prepared",
    "claim started",
    "claimed",
    "in a slot",
    "done",
    "commit started",
    "committed",
)


class Clock:
    """The moment each message passed each stage, and the groups' sizes and durations."""

    def __init__(self) -> None:
        self.at: dict[int, dict[str, float]] = defaultdict(dict)
        self.groups: dict[str, list[tuple[int, float]]] = defaultdict(list)
        # When each group's ack was handed over, and the broker's turns measured from them.
        self.acked: list[float] = []
        self.turns: list[float] = []
        # The backends of the claiming and the committing connections, by statement.
        self.backends = Backends()

    def mark(self, deliveries, stage: str) -> None:
        now = time.perf_counter()
        for delivery in deliveries:
            self.at[id(delivery)][stage] = now

    def report(self) -> None:
        steps: dict[str, list[float]] = defaultdict(list)
        for marks in self.at.values():
            if len(marks) < len(STAGES):
                continue  # a delivery not through every stage (none in a clean run)
            for earlier, later in itertools.pairwise(STAGES):
                steps[f"{earlier} -> {later}"].append(marks[later] - marks[earlier])
            steps["whole"].append(marks["committed"] - marks["received"])
        for name, values in steps.items():
            values.sort()
            print(
                f"  {name:28s} median {statistics.median(values) * 1e3:6.2f} ms"
                f"  p90 {values[int(len(values) * 0.9)] * 1e3:6.2f} ms"
            )
        if self.turns:
            print(
                f"  {'the broker refills':28s} median {statistics.median(self.turns) * 1e3:6.2f} ms"
                "  (an ack handed to the I/O thread -> the next delivery received)"
            )
        for name, groups in self.groups.items():
            sizes = [size for size, _ in groups]
            took = statistics.median(seconds for _, seconds in groups)
            print(
                f"  {name}: {len(groups)} statements, {statistics.mean(sizes):.1f} runs each,"
                f" {took * 1e3:.2f} ms at the median{self.backends.per_statement(name)}"
            )

    def received(self, at: float) -> None:
        if self.acked:
            self.turns.extend(at - acked for acked in self.acked)
            self.acked.clear()


class Backends:
    """PostgreSQL's CPU time for the claims and the commits: each connection's backend
    process, read from ``/proc`` while it lives (its last reading counts)."""

    def __init__(self) -> None:
        self.pids: dict[str, set[int]] = defaultdict(set)
        self.statements: dict[str, int] = defaultdict(int)
        self.cpu: dict[int, float] = {}
        self.tick = os.sysconf("SC_CLK_TCK")

    def executed(self, name: str, pid: int) -> None:
        self.pids[name].add(pid)
        self.statements[name] += 1

    def sample(self) -> None:
        for pids in list(self.pids.values()):
            for pid in list(pids):
                try:
                    with open(f"/proc/{pid}/stat") as stat:
                        fields = stat.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue  # ended, or PostgreSQL runs elsewhere
                self.cpu[pid] = (int(fields[11]) + int(fields[12])) / self.tick

    def per_statement(self, name: str) -> str:
        cpu = sum(self.cpu.get(pid, 0.0) for pid in self.pids[name])
        if not cpu or not self.statements[name]:
            return ""
        return f"; PostgreSQL CPU {cpu / self.statements[name] * 1e3:.2f} ms each"


def wrapped(clock: Clock) -> None:
    """Wrap the window's hand-overs so that each reads the clock."""
    on_message = RabbitMQConsumer._on_message

    def _on_message(self, destination, channel, method, properties, body):
        on_message(self, destination, channel, method, properties, body)
        clock.mark(self._received[-1:], "received")
        clock.received(time.perf_counter())

    ack_many = RabbitMQConsumer.ack_many

    def _ack_many(self, deliveries, *, wait=True):
        clock.acked.append(time.perf_counter())
        return ack_many(self, deliveries, wait=wait)

    execute = runs._Prepared.execute

    def _execute(self, sql, params=None):
        name = {runs._CLAIM_MANY: "claims", runs._SUCCEEDED_MANY: "commits"}.get(sql)
        if name is not None:
            clock.backends.executed(name, self._cursor.connection.info.backend_pid)
        return execute(self, sql, params)

    prepare = RunWindow.prepare

    def _prepare(self, deliveries):
        clock.mark(deliveries, "prepared")
        return prepare(self, deliveries)

    claim = RunWindow._claim

    def _claim(self, batch):
        started = time.perf_counter()
        clock.mark([prepared.delivery for prepared in batch], "claim started")
        try:
            return claim(self, batch)
        finally:
            clock.mark([prepared.delivery for prepared in batch], "claimed")
            clock.groups["claims"].append((len(batch), time.perf_counter() - started))

    process = TaskProcessor.process

    def _process(self, delivery):
        clock.mark([delivery], "in a slot")
        return process(self, delivery)

    settle = RunWindow.settle

    def _settle_one(self, delivery, lease, outcome):
        clock.mark([delivery], "done")
        return settle(self, delivery, lease, outcome)

    settle_group = RunWindow._settle

    def _settle_group(self, outcomes):
        started = time.perf_counter()
        clock.mark([item.delivery for item in outcomes], "commit started")
        try:
            return settle_group(self, outcomes)
        finally:
            clock.mark([item.delivery for item in outcomes], "committed")
            clock.groups["commits"].append((len(outcomes), time.perf_counter() - started))

    RabbitMQConsumer._on_message = _on_message
    RabbitMQConsumer.ack_many = _ack_many
    runs._Prepared.execute = _execute
    RunWindow.prepare = _prepare
    RunWindow._claim = _claim
    TaskProcessor.process = _process
    RunWindow.settle = _settle_one
    RunWindow._settle = _settle_group


def statements_alone(count: int) -> None:
    """The claim and the group commit, on one connection in this one thread."""
    run_ids = [uuid.UUID(run_id) for run_id in bench.feed(count)]
    with runs._prepared_cursor() as cursor:
        for size in (16, 64):
            took: dict[str, list[float]] = defaultdict(list)
            for start in range(0, len(run_ids) // 2, size):
                group = run_ids[start : start + size]
                holders = [f"stages-{number}" for number in range(len(group))]
                for name, sql, params in (
                    ("claim", runs._CLAIM_MANY, {"seconds": [30.0] * len(group)}),
                    ("commit", runs._SUCCEEDED_MANY, {}),
                ):
                    began = time.perf_counter()
                    cursor.execute(sql, {"run_ids": group, "holders": holders, **params})
                    cursor.fetchall()
                    took[name].append(time.perf_counter() - began)
            # The second half for the next size: runs not claimed yet.
            run_ids = run_ids[len(run_ids) // 2 :]
            print(
                f"  alone, groups of {size}: claim {statistics.median(took['claim']) * 1e3:.2f} ms,"
                f" group commit {statistics.median(took['commit']) * 1e3:.2f} ms (medians)"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=4)
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    clock = Clock()
    wrapped(clock)
    sampling = threading.Event()

    def sample() -> None:
        while sampling.wait():
            clock.backends.sample()
            time.sleep(0.05)

    threading.Thread(target=sample, daemon=True).start()
    with bench.prepared():
        for number in range(1, args.rounds + 1):
            clock.__init__()
            note = load_note()
            run_ids = bench.feed(args.messages)
            sampling.set()
            try:
                rate, cpu = bench.through_worker(run_ids, args.concurrency)
            finally:
                sampling.clear()
            print(
                f"round {number} ({note} at its start): {rate:,.0f}/s, {cpu * 1e6:.0f} us cpu/msg"
            )
            clock.report()
        statements_alone(args.messages)


if __name__ == "__main__":
    main()
