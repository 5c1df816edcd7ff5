"""Worker throughput: no-op tasks per second through one worker process, against the same
broker consumed raw and, on RabbitMQ, against Celery 5, in interleaved rounds.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_runtime \\
        .venv/bin/python bench/worker.py [--rabbitmq N] [--sqs N] [--concurrency C] \\
        [--prefetch-per-slot P] [--rounds R] [--no-celery] [--floor]

The database is created and migrated if needed; Celery is the optional ``bench``
dependency (``pip install -e '.[bench]'``). SQS is moto's server on loopback, started here.
Everything lives under the queue prefix ``benchw-`` and the exchange ``dom_med_benchw``,
and its rows are the ``bench.noop`` task's: all of it is purged at start (a crashed run
leaves nothing that disturbs the next) and at the end.

Each round runs, in an order rotated from round to round, on quorum queues of the same
broker with the same number of messages:

- ``raw``: a bare pika consumer acking each message, prefetch = concurrency;
- ``raw-deep`` (RabbitMQ): the same with the prefetch our worker uses (its window:
  ``--prefetch-per-slot`` per slot, ``WORKER_PREFETCH_PER_SLOT`` unless given);
- ``ours``: the worker ``run_worker`` builds (``build_task_worker``), ``concurrency``
  slots, with its two durable records per task in ``task_runs`` (the claim, the success)
  and its acks; messages fed the real way (dispatch, then the relay's engine);
- ``floor`` (RabbitMQ, with ``--floor``): the least any worker keeping our two durable
  records can do, as a bound for ``ours``: one thread consumes (the window's prefetch),
  claims what each poll brought with the worker's own statement, hands the runs to
  ``concurrency`` threads that call the handler and nothing else, commits what they
  finished with the group commit's statement and acks it (``multiple``). No leases kept,
  no time limits, no logs, metrics or traces, no recovery from any failure;
- ``celery-threads`` / ``celery-prefork``: a Celery worker (``bench/celery_noop.py``),
  ``concurrency`` threads or processes, ``acks_late``, prefetch multiplier 1, no result
  backend.

The clock runs from the first message taken (raw: received; ours and Celery: the first
handler call) to the last settled (raw: acked; ours: committed and acked; Celery: its last
task returned, its ack follows), so no consumer's start-up counts.

Beside each rate of the contenders that run in this process (raw, raw-deep, ours), the
CPU time this process spent per message (``cpu/msg``, user and system, from the first
message to the last; ours from the worker's start to its stop, so a little more): a
figure other processes on the machine disturb far less than a rate, to compare while the
machine is busy. The worker runs with ``DEBUG`` off, as in production.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import queue
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

# moto's server logs every request at INFO; the figures are what matters here.
logging.getLogger("werkzeug").setLevel(logging.WARNING)

import pika  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.database import ensure_migrated  # noqa: E402
from bench.load import Rounds, add_load_arguments, require_quiet  # noqa: E402
from broker import topology  # noqa: E402
from broker.sqs.publisher import sqs_client  # noqa: E402
from outbox.handlers import task  # noqa: E402
from outbox.models import TaskRun  # noqa: E402
from outbox.runs import Begin, Lease, RunLedger, new_holder  # noqa: E402
from outbox.services import dispatch  # noqa: E402
from relay.engine import OutboxRelay  # noqa: E402
from worker.builders import build_task_worker, window_for  # noqa: E402

PREFIX = "benchw-"
EXCHANGE = "dom_med_benchw"
CELERY_QUEUE = f"{PREFIX}celery"
# A Celery worker that completes nothing more for this long has stalled.
STALL_SECONDS = 20.0
_first_call: list[float] = []


@task("bench.noop")
def noop(message) -> None:
    if not _first_call:
        _first_call.append(time.perf_counter())


def feed(count: int) -> list[str]:
    """Dispatch ``count`` no-op tasks and let the relay deliver them (not timed)."""
    run_ids = []
    with transaction.atomic():
        for number in range(count):
            run_ids.append(str(dispatch("bench.noop", {"n": number})))
    relay = OutboxRelay()
    try:
        relay.transport.setup_topology()
        while relay.relay_one_batch():
            pass
        relay.relay_one_batch()
    finally:
        relay.close()
    # What autovacuum does in production, and this machine's PostgreSQL is not set to do:
    # the dead rows of earlier rounds cleared, the statistics told of the backlog.
    with connection.cursor() as cursor:
        for table in ("task_runs", "platform_outbox_messages"):
            cursor.execute(f"VACUUM (ANALYZE) {table}")
    return run_ids


def cpu_seconds() -> float:
    """CPU time of this process so far, user and system."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def raw_rabbitmq(count: int, prefetch: int) -> tuple[float, float]:
    """Messages per second of a bare pika consumer acking each message, and its CPU
    seconds per message."""
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=prefetch)
    started = cpu = 0.0
    consumed = channel.consume(topology.queue_name("default"))
    for seen, (method, _properties, _body) in enumerate(consumed, start=1):
        if seen == 1:
            started, cpu = time.perf_counter(), cpu_seconds()
        channel.basic_ack(method.delivery_tag)
        if seen == count:
            break
    elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    channel.cancel()
    conn.close()
    return count / elapsed, cpu / count


def floor_rabbitmq(run_ids: list[str], concurrency: int) -> tuple[float, float]:
    """Tasks per second of the floor (see the module's text), and its CPU seconds per task."""
    count, ledger = len(run_ids), RunLedger()
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=window_for(concurrency))
    received: list[tuple[int, bytes]] = []
    channel.basic_consume(
        topology.queue_name("default"),
        on_message_callback=lambda _c, method, _p, body: received.append(
            (method.delivery_tag, body)
        ),
    )
    work: queue.SimpleQueue = queue.SimpleQueue()
    finished: list[tuple[int, Lease]] = []
    finished_lock = threading.Lock()

    def slot() -> None:
        while (item := work.get()) is not None:
            noop(item)
            with finished_lock:
                finished.append(item)
                first = len(finished) == 1
            if first:
                # Wakes the consuming thread's poll.
                conn.add_callback_threadsafe(lambda: None)

    slots = [threading.Thread(target=slot, daemon=True) for _ in range(concurrency)]
    for thread in slots:
        thread.start()
    settled, acked, done = set(), 0, 0
    started = cpu = 0.0
    try:
        while done < count:
            conn.process_data_events(time_limit=0.05)
            if received:
                if not started:
                    started, cpu = time.perf_counter(), cpu_seconds()
                batch, received[:] = list(received), []
                claims = [(json.loads(body), new_holder(), 60.0) for _tag, body in batch]
                begun = ledger.begin_many(claims)
                for (tag, _body), (envelope, holder, seconds) in zip(batch, claims, strict=True):
                    assert begun[holder].decision is Begin.RUN, begun[holder]
                    work.put((tag, Lease(str(envelope["run_id"]), holder, seconds, seconds / 3)))
            with finished_lock:
                ready, finished[:] = list(finished), []
            if ready:
                ledger.succeeded_many([lease for _tag, lease in ready])
                settled.update(tag for tag, _lease in ready)
                top = acked
                while top + 1 in settled:
                    top += 1
                    settled.discard(top)
                if top > acked:
                    channel.basic_ack(top, multiple=True)
                    acked = top
                done += len(ready)
        elapsed, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    finally:
        for _thread in slots:
            work.put(None)
        conn.close()
    succeeded = TaskRun.objects.filter(run_id__in=run_ids, status=TaskRun.Status.SUCCEEDED).count()
    assert succeeded == count, f"only {succeeded} of {count} runs succeeded"
    return count / elapsed, cpu / count


def raw_sqs(count: int) -> float:
    """Messages per second of bare boto3: receive 10, delete them in one batch."""
    client = sqs_client()
    url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
    seen = 0
    started = time.perf_counter()
    while seen < count:
        messages = client.receive_message(
            QueueUrl=url, MaxNumberOfMessages=10, WaitTimeSeconds=1
        ).get("Messages", [])
        if messages:
            client.delete_message_batch(
                QueueUrl=url,
                Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)
                ],
            )
        seen += len(messages)
    elapsed = time.perf_counter() - started
    client.close()
    return count / elapsed


def through_worker(run_ids: list[str], concurrency: int) -> tuple[float, float]:
    """Tasks per second through the worker, and this process's CPU seconds per task."""
    built = build_task_worker(
        ["default"], concurrency=concurrency, stop_budget=5, poll_interval=0.05
    )
    processor, worker = built.processor, built.loop
    _first_call.clear()
    cpu = cpu_seconds()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # Watched in memory (a query per look would compete for the same two cores).
    while processor.outcomes["succeeded"] < len(run_ids):
        time.sleep(0.002)
    elapsed = time.perf_counter() - _first_call[0]
    worker.stop()
    thread.join(timeout=30)
    cpu = cpu_seconds() - cpu
    done = TaskRun.objects.filter(run_id__in=run_ids, status=TaskRun.Status.SUCCEEDED).count()
    assert done == len(run_ids), f"only {done} of {len(run_ids)} runs succeeded"
    return len(run_ids) / elapsed, cpu / len(run_ids)


def celery_environment(count: int, clock: Path) -> dict[str, str]:
    return dict(
        os.environ,
        BENCH_CELERY_QUEUE=CELERY_QUEUE,
        BENCH_CELERY_MESSAGES=str(count),
        BENCH_CELERY_CLOCK=str(clock),
        BENCH_CELERY_BROKER=settings.RABBITMQ_URL,
        PYTHONPATH=str(ROOT),
    )


def through_celery(count: int, concurrency: int, pool: str) -> float:
    """Fill Celery's queue (not timed), then run a Celery worker until it took them all."""
    with tempfile.TemporaryDirectory() as folder:
        clock = Path(folder) / "clock"
        env = celery_environment(count, clock)
        feeder = subprocess.run(
            [sys.executable, "-c", CELERY_FEED, str(count)],
            env=env,
            check=True,
            capture_output=True,
            text=True,
        )
        assert "fed" in feeder.stdout, feeder.stderr
        worker = subprocess.Popen(
            [
                str(Path(sys.executable).parent / "celery"),
                "-A",
                "bench.celery_noop",
                "worker",
                "--pool",
                pool,
                "--concurrency",
                str(concurrency),
                "--prefetch-multiplier",
                "1",
                "--queues",
                CELERY_QUEUE,
                "--without-gossip",
                "--without-mingle",
                "--without-heartbeat",
                "--loglevel",
                "WARNING",
            ],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        progress, changed = "", time.monotonic()
        try:
            while True:
                text = clock.read_text() if clock.exists() else ""
                if text != progress:
                    progress, changed = text, time.monotonic()
                if text and int(text.split()[2]) >= count:
                    break
                if worker.poll() is not None or time.monotonic() - changed > STALL_SECONDS:
                    break
                time.sleep(0.05)
        finally:
            worker.terminate()
            try:
                worker.wait(timeout=20)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        if not progress:
            raise RuntimeError(f"the Celery worker ran no task: {worker.stderr.read()[-2000:]}")
        first, last, done = progress.split()
        if int(done) < count:
            print(
                f"warning: the Celery worker ({pool}) stalled after {done} of {count} tasks; "
                "its rate is of those",
                file=sys.stderr,
            )
        return int(done) / (float(last) - float(first))


# Publishes the Celery messages through Celery itself (``send_task``), one process.
CELERY_FEED = """
import sys
from bench.celery_noop import app
count = int(sys.argv[1])
with app.producer_or_acquire() as producer:
    for number in range(count):
        app.send_task("bench.noop", args=[number], producer=producer)
print("fed", count)
"""


def bench(
    broker: str, count: int, concurrency: int, rounds: int, celery: bool, floor: bool = False
) -> None:
    """``rounds`` times each contender, in an order rotated per round; each round's figures,
    then the medians (the machine is shared: single runs vary)."""
    contenders = ["raw", "ours"]
    if broker == "rabbitmq":
        contenders.append("raw-deep")
        if floor:
            contenders.append("floor")
    if celery and broker == "rabbitmq":
        contenders += ["celery-threads", "celery-prefork"]
    rates: dict[str, list[float]] = {name: [] for name in contenders}
    cpus: dict[str, list[float]] = {name: [] for name in contenders}
    settings.BROKER = broker
    begun = Rounds()
    for round_number in range(1, rounds + 1):
        load = begun.start()
        shift = (round_number - 1) % len(contenders)
        for name in contenders[shift:] + contenders[:shift]:
            cpu = None
            if name == "raw":
                feed(count)
                if broker == "rabbitmq":
                    rate, cpu = raw_rabbitmq(count, concurrency)
                else:
                    rate = raw_sqs(count)
            elif name == "raw-deep":
                feed(count)
                rate, cpu = raw_rabbitmq(count, window_for(concurrency))
            elif name == "ours":
                rate, cpu = through_worker(feed(count), concurrency)
            elif name == "floor":
                rate, cpu = floor_rabbitmq(feed(count), concurrency)
            else:
                rate = through_celery(count, concurrency, name.split("-")[1])
            cleanup(broker)
            rates[name].append(rate)
            if cpu is not None:
                cpus[name].append(cpu)
        print(
            f"{broker:8} round {round_number} ({load} at its start): messages={count} "
            f"concurrency={concurrency} window={window_for(concurrency)} "
            + "  ".join(
                f"{name}={rates[name][-1]:7.0f}/s"
                + (f" ({cpus[name][-1] * 1e6:.0f} us cpu/msg)" if cpus[name] else "")
                for name in contenders
            ),
            flush=True,
        )
    # The summary: the rounds that count alone.
    rates = {name: begun.kept(values) for name, values in rates.items()}
    cpus = {name: begun.kept(values) if values else values for name, values in cpus.items()}
    ours = statistics.median(rates["ours"])
    print(
        f"{broker:8} medians of {begun.note()}: "
        + "  ".join(f"{name}={statistics.median(rates[name]):7.0f}/s" for name in contenders)
    )
    for name in contenders:
        if name == "ours":
            continue
        per_round = sorted(o / r for o, r in zip(rates["ours"], rates[name], strict=True))
        print(
            f"{broker:8} ours / {name}: {ours / statistics.median(rates[name]):.2f} "
            f"(per round {per_round[0]:.2f}-{per_round[-1]:.2f})"
            + (
                f"; cpu/msg {statistics.median(cpus['ours']) / statistics.median(cpus[name]):.2f}"
                f"x its own"
                if cpus[name] and cpus["ours"]
                else ""
            )
        )


def cleanup(broker: str) -> None:
    """Delete this benchmark's queues (those a crashed run left included)."""
    if broker != "rabbitmq":
        return
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        channel.queue_delete(CELERY_QUEUE)
        channel.exchange_delete(CELERY_QUEUE)
        for queue_class in topology.QUEUES:
            channel.queue_delete(topology.queue_name(queue_class))
            channel.queue_delete(topology.dead_letter_queue_name(queue_class))
    finally:
        conn.close()


def purge() -> None:
    """Start from a known state: what a crashed run may have left, removed."""
    with connection.cursor() as cursor:
        cursor.execute(
            "DELETE FROM platform_outbox_messages WHERE envelope->>'task' = 'bench.noop'"
        )
        cursor.execute("DELETE FROM task_runs WHERE task = 'bench.noop'")
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        channel.queue_delete(CELERY_QUEUE)
        channel.exchange_delete(CELERY_QUEUE)
        channel.exchange_delete(EXCHANGE)
    finally:
        conn.close()
    cleanup("rabbitmq")


def start_moto() -> str:
    from moto.server import ThreadedMotoServer

    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        os.environ.setdefault(name, "testing")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False).start()
    return f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rabbitmq", type=int, default=3000, help="messages (0: skip)")
    parser.add_argument("--sqs", type=int, default=500, help="messages (0: skip)")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--prefetch-per-slot",
        type=int,
        default=None,
        help="our worker's window per slot, and raw-deep's prefetch with it "
        "(default: WORKER_PREFETCH_PER_SLOT)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="measurements per contender")
    parser.add_argument("--no-celery", action="store_true", help="skip the Celery workers")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also the floor: consume, the two statements and the acks, nothing else",
    )
    add_load_arguments(parser)
    args = parser.parse_args()
    if args.rabbitmq and not args.no_celery and importlib.util.find_spec("celery") is None:
        # Said before anything is measured, not as a traceback after the first contenders.
        parser.error("Celery is not installed: pip install -e '.[bench]', or pass --no-celery")
    if args.prefetch_per_slot is not None:
        if args.prefetch_per_slot < 1:
            parser.error("--prefetch-per-slot must be at least 1")
        settings.WORKER_PREFETCH_PER_SLOT = args.prefetch_per_slot
    require_quiet(args)
    with prepared():
        if args.rabbitmq:
            bench(
                "rabbitmq",
                args.rabbitmq,
                args.concurrency,
                args.rounds,
                not args.no_celery,
                args.floor,
            )
        if args.sqs:
            settings.SQS_ENDPOINT_URL = start_moto()
            bench("sqs", args.sqs, args.concurrency, args.rounds, False)


@contextlib.contextmanager
def prepared() -> Iterator[None]:
    """The database migrated, the no-op task in the catalog, the benchmark's own exchange
    and queues, nothing left from a crashed run; all of it removed at the end."""
    ensure_migrated()
    catalog = json.loads((ROOT / "tasks.json").read_text())
    catalog["tasks"].append({"name": "bench.noop", "queue": "default"})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(catalog, handle)
    settings.TASKS_CATALOG = handle.name
    # As in production: no DEBUG, which wraps every statement and keeps it in memory.
    settings.DEBUG = False
    settings.RABBITMQ_EXCHANGE = EXCHANGE
    settings.QUEUE_PREFIX = PREFIX
    purge()
    try:
        yield
    finally:
        os.unlink(handle.name)
        purge()


if __name__ == "__main__":
    main()
