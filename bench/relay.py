"""Relay benchmarks: drain throughput against the raw broker, and commit-to-broker latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hubdommed_bench .venv/bin/python bench/relay.py

Creates and migrates the database if needed. Its exchange and queues are named after the
database (``bench-<database>-``): a run first deletes what a crashed run left there (queues,
exchange, outbox rows), so every run starts from the same empty state, and deletes them
again at the end. Reports ratios measured in this one run (the machine is shared):

1. RabbitMQ, in interleaved rounds (the order rotates each round), medians reported: the
   relay draining N pending rows (publisher confirms, marking sent_at, two batches in
   flight) against raw pika publishing the same messages without confirms (the broker's
   ceiling) and raw pika publishing them with pipelined confirms (every message written,
   then every confirm awaited: the floor of any publisher that knows what the broker took).
2. SQS (moto's server on loopback): the relay against raw boto3 ``SendMessageBatch`` calls.
3. Commit-to-broker latency over dispatches at a steady rate, with the wake signal and with
   the sweep only (a relay subprocess, as in production).
4. The drain of (1) again with a large history of already-sent rows in the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")

import django  # noqa: E402

django.setup()

import logging  # noqa: E402

logging.getLogger("werkzeug").setLevel(logging.WARNING)

import pika  # noqa: E402
import redis  # noqa: E402
from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from bench.load import Rounds, add_load_arguments, require_quiet  # noqa: E402
from broker import get_transport, topology  # noqa: E402
from broker.rabbitmq.publisher import message_properties  # noqa: E402
from broker.sqs.publisher import batch_entries, sqs_client  # noqa: E402
from broker.topology import QUEUES  # noqa: E402
from outbox.services import dispatch  # noqa: E402
from relay.engine import OutboxRelay  # noqa: E402
from tests.processes import process_environment  # noqa: E402


def insert_rows(count: int, *, sent: bool = False, queue: str = "default") -> None:
    """``count`` platform rows shaped like dispatch's (about 400 bytes of envelope each)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            INSERT INTO platform_outbox_messages (run_id, queue, envelope, available_at, sent_at)
            SELECT r.run_id, %(queue)s,
                   jsonb_build_object(
                       'version', 1, 'run_id', r.run_id::text, 'task', 'reports.build',
                       'queue', %(queue)s, 'destination', %(queue)s, 'event', null,
                       'event_id', null, 'tenant', null,
                       'payload', jsonb_build_object('n', r.n, 'report', 'monthly-usage',
                                                     'filters', jsonb_build_object(
                                                         'from', '2025-01-01',
                                                         'to', '2025-01-31')),
                       'occurred_at', clock_timestamp()::text,
                       'correlation_id', 'bench-' || r.run_id::text),
                   clock_timestamp(),
                   CASE WHEN %(sent)s THEN clock_timestamp() END
              FROM (SELECT n, gen_random_uuid() AS run_id
                      FROM generate_series(1, %(count)s) AS n) AS r
            """,
            {"queue": queue, "count": count, "sent": sent},
        )


def pending_bodies() -> list[tuple[str, str, str]]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT run_id::text, envelope::text, envelope->>'correlation_id' "
            "FROM platform_outbox_messages "
            "WHERE sent_at IS NULL ORDER BY id"
        )
        return cursor.fetchall()


def truncate() -> None:
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE platform_outbox_messages, outbox_messages, task_runs")


def relay_drain(batch_size: int) -> float:
    relay = OutboxRelay(batch_size=batch_size)
    relay.transport.setup_topology()
    started = time.perf_counter()
    relay.drain()
    elapsed = time.perf_counter() - started
    relay.close()
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NULL")
        assert cursor.fetchone()[0] == 0, "the relay left rows pending"
    return elapsed


def rabbit_channel():
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    return conn, conn.channel()


def queue_depth(channel, destination: str) -> int:
    return channel.queue_declare(
        topology.queue_name(destination), passive=True
    ).method.message_count


def purge_rabbit(destination: str) -> None:
    conn, channel = rabbit_channel()
    channel.queue_purge(topology.queue_name(destination))
    conn.close()


def _message(run_id: str, body: str, correlation_id: str):
    from broker.base import OutgoingMessage

    return OutgoingMessage(
        key=0,
        run_id=run_id,
        destination="default",
        task="reports.build",
        body=body.encode(),
        correlation_id=correlation_id,
    )


# Seconds one publisher's run may take before the benchmark gives up on the broker.
ROUND_TIMEOUT = 300


def _select_publish(rows, *, confirm: bool) -> tuple[float, float, dict]:
    """Publish the rows through a ``SelectConnection`` (pika's fastest way to write):
    (the clock at the first publish, at the end, the confirms' tally). With ``confirm``
    the end is the last confirm; without, the queue holding every message."""
    total = len(rows)
    settled = bytearray(total + 1)
    state = {"count": 0, "low": 0, "nacked": 0, "started": 0.0, "finished": 0.0}
    key = topology.routing_key("default", "reports.build")

    def on_confirm(frame) -> None:
        method = frame.method
        tags = range(state["low"] + 1, method.delivery_tag + 1) if method.multiple else ()
        for tag in tags or (method.delivery_tag,):
            if not settled[tag]:
                settled[tag] = 1
                state["count"] += 1
        if method.multiple:
            state["low"] = max(state["low"], method.delivery_tag)
        if not isinstance(method, pika.spec.Basic.Ack):
            state["nacked"] += 1
        if state["count"] == total:
            state["finished"] = time.perf_counter()
            conn.close()

    def publish_all(channel) -> None:
        state["started"] = time.perf_counter()
        for run_id, body, correlation_id in rows:
            message = _message(run_id, body, correlation_id)
            channel.basic_publish(
                settings.RABBITMQ_EXCHANGE, key, message.body, message_properties(message)
            )
        if not confirm:
            conn.channel(on_open_callback=watch_depth)

    def watch_depth(channel) -> None:
        """Without confirms: the clock stops when the queue holds every message."""

        def on_depth(frame) -> None:
            if frame.method.message_count >= total:
                state["finished"] = time.perf_counter()
                conn.close()
            else:
                conn.ioloop.call_later(0.005, ask)

        def ask() -> None:
            channel.queue_declare(topology.queue_name("default"), passive=True, callback=on_depth)

        ask()

    def on_channel(channel) -> None:
        if confirm:
            channel.confirm_delivery(on_confirm, callback=lambda _frame: publish_all(channel))
        else:
            publish_all(channel)

    def on_close(_conn, _reason) -> None:
        conn.ioloop.stop()

    conn = pika.SelectConnection(
        pika.URLParameters(settings.RABBITMQ_URL),
        on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
        on_open_error_callback=lambda _c, exc: conn.ioloop.stop(),
        on_close_callback=on_close,
    )
    # A broker that stops answering ends the round with an error, not a hang.
    conn.ioloop.call_later(ROUND_TIMEOUT, conn.ioloop.stop)
    conn.ioloop.start()
    if not state["finished"]:
        raise RuntimeError(f"RabbitMQ did not answer within {ROUND_TIMEOUT} s: {state}")
    return state["started"], state["finished"], state


def raw_pika_publish(rows) -> float:
    """The ceiling: the same messages, persistent, no confirms, written as fast as pika
    writes, the clock stopped when the queue holds them all."""
    started, finished, _ = _select_publish(rows, confirm=False)
    return finished - started


def raw_pika_confirmed(rows) -> float:
    """The same messages with publisher confirms, pipelined: every message written, the
    clock stopped at the last confirm."""
    started, finished, state = _select_publish(rows, confirm=True)
    assert state["count"] == len(rows) and not state["nacked"], state
    return finished - started


RABBITMQ_CONTENDERS = ("relay", "raw_unconfirmed", "raw_confirmed")


def bench_rabbitmq(rows: int, batch_size: int, rounds: int) -> dict:
    """Interleaved rounds of the three; rates and per-round ratios, medians."""
    seconds: dict[str, list[float]] = {name: [] for name in RABBITMQ_CONTENDERS}
    begun = Rounds()
    for number in range(rounds):
        truncate()
        insert_rows(rows)
        bodies = pending_bodies()
        purge_rabbit("default")
        load = begun.start()
        shift = number % len(RABBITMQ_CONTENDERS)
        for name in RABBITMQ_CONTENDERS[shift:] + RABBITMQ_CONTENDERS[:shift]:
            if name == "relay":
                seconds[name].append(relay_drain(batch_size))
            elif name == "raw_unconfirmed":
                seconds[name].append(raw_pika_publish(bodies))
            else:
                seconds[name].append(raw_pika_confirmed(bodies))
            purge_rabbit("default")
        print(
            "rabbitmq round",
            number + 1,
            f"({load} at its start)",
            json.dumps({name: round(rows / seconds[name][-1]) for name in seconds}),
            flush=True,
        )
    # The summary: the rounds that count alone.
    seconds = {name: begun.kept(values) for name, values in seconds.items()}
    relay = seconds["relay"]

    def ratios(name: str) -> list[float]:
        return [raw / ours for raw, ours in zip(seconds[name], relay, strict=True)]

    return {
        "rows": rows,
        "rounds": rounds,
        "summary_over": begun.note(),
        "batch": batch_size,
        **{
            f"{name}_per_s": round(rows / statistics.median(values))
            for name, values in seconds.items()
        },
        "ratio_to_raw_unconfirmed": round(statistics.median(ratios("raw_unconfirmed")), 3),
        "ratio_to_raw_confirmed": round(statistics.median(ratios("raw_confirmed")), 3),
        "ratio_to_raw_unconfirmed_per_round": [round(r, 3) for r in ratios("raw_unconfirmed")],
    }


def bench_sqs(rows: int, batch_size: int) -> dict:
    from moto.server import ThreadedMotoServer

    from tests.aws import _FAKE_CREDENTIALS, _free_port

    os.environ.update(_FAKE_CREDENTIALS)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    saved = settings.BROKER, settings.SQS_ENDPOINT_URL
    settings.BROKER, settings.SQS_ENDPOINT_URL = "sqs", f"http://127.0.0.1:{port}"
    try:
        truncate()
        insert_rows(rows)
        bodies = pending_bodies()
        relay_seconds = relay_drain(batch_size)
        from broker.base import OutgoingMessage

        client = sqs_client()
        url = client.get_queue_url(QueueName=topology.queue_name("default"))["QueueUrl"]
        # moto's queue slows down as it fills: both runs start from an empty queue.
        client.purge_queue(QueueUrl=url)
        messages = [
            OutgoingMessage(0, run_id, "default", "reports.build", body.encode(), cid)
            for run_id, body, cid in bodies
        ]
        started = time.perf_counter()
        for call in batch_entries(messages):
            response = client.send_message_batch(QueueUrl=url, Entries=[e for _, e in call])
            assert not response.get("Failed")
        raw_seconds = time.perf_counter() - started
        client.close()
    finally:
        settings.BROKER, settings.SQS_ENDPOINT_URL = saved
        server.stop()
    return {
        "rows": rows,
        "relay_per_s": rows / relay_seconds,
        "raw_per_s": rows / raw_seconds,
        "ratio": raw_seconds / relay_seconds,
    }


def relay_process(sweep: float) -> subprocess.Popen:
    env = process_environment(
        settings,
        BROKER="rabbitmq",
        HUBDOMMED_RELAY="true",
        RELAY_SWEEP_INTERVAL=str(sweep),
        LOG_LEVEL="info",
    )
    return subprocess.Popen(
        [sys.executable, "manage.py", "run_relay"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(os.environ.get("RELAY_BENCH_LOG", os.devnull), "a"),
    )


def bench_latency(count: int, rate: float, *, wake: bool, sweep: float) -> dict:
    truncate()
    committed: dict[str, float] = {}
    received: dict[str, float] = {}
    queue = topology.queue_name("maintenance")
    done = threading.Event()

    def consume():
        conn, channel = rabbit_channel()
        for method, properties, _body in channel.consume(
            queue, auto_ack=True, inactivity_timeout=0.2
        ):
            if method is not None:
                received[properties.message_id] = time.perf_counter()
            if done.is_set() and len(received) >= count:
                break
        channel.cancel()
        conn.close()

    process = relay_process(sweep)
    real_key = settings.OUTBOX_WAKE_KEY
    try:
        time.sleep(2)  # let it start and go idle
        purge_rabbit("maintenance")  # the hourly purge it enqueued at start
        consumer = threading.Thread(target=consume)
        consumer.start()
        if not wake:
            # The signal goes where no relay listens: only the sweep finds the rows.
            settings.OUTBOX_WAKE_KEY = f"{real_key}:nobody"
        interval = 1.0 / rate
        next_at = time.perf_counter()
        for n in range(count):
            with transaction.atomic():
                run_id = dispatch("maintenance.purge", {"n": n})
                stamp = time.perf_counter()
            committed[str(run_id)] = stamp
            next_at += interval
            time.sleep(max(0.0, next_at - time.perf_counter()))
        done.set()
        consumer.join(timeout=sweep * 3 + 30)
    finally:
        settings.OUTBOX_WAKE_KEY = real_key
        process.terminate()
        process.wait(timeout=30)
    latencies = sorted((received[r] - committed[r]) * 1000 for r in committed if r in received)
    return {
        "count": count,
        "received": len(latencies),
        "p50_ms": statistics.median(latencies),
        "p99_ms": latencies[int(len(latencies) * 0.99) - 1],
        "max_ms": latencies[-1],
        "over_100ms": sum(1 for latency in latencies if latency > 100),
    }


def bench_history(rows: int, history: int, batch_size: int) -> dict:
    truncate()
    started = time.perf_counter()
    insert_rows(history, sent=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE platform_outbox_messages")
    fill = time.perf_counter() - started
    insert_rows(rows)
    seconds = relay_drain(batch_size)
    purge_rabbit("default")
    truncate()
    return {"rows": rows, "history": history, "relay_per_s": rows / seconds, "fill_s": fill}


def cleanup() -> None:
    """Delete the run's queues and exchange (those of a crashed run too: same names)."""
    conn, channel = rabbit_channel()
    for destination in QUEUES:
        channel.queue_delete(topology.queue_name(destination))
        channel.queue_delete(topology.dead_letter_queue_name(destination))
    channel.exchange_delete(settings.RABBITMQ_EXCHANGE)
    conn.close()
    redis.Redis.from_url(settings.REDIS_URL).delete(settings.OUTBOX_WAKE_KEY)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--sqs-rows", type=int, default=1_000)
    parser.add_argument("--latency-count", type=int, default=1_000)
    parser.add_argument("--rate", type=float, default=100.0, help="dispatches per second")
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=settings.RELAY_BATCH_SIZE)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["rabbitmq", "sqs", "latency", "history"])
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)

    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)
    # Named after the database: a crashed run's leftovers are found, and deleted, here.
    tag = settings.DATABASES["default"]["NAME"]
    settings.QUEUE_PREFIX = f"bench-{tag}-"
    settings.RABBITMQ_EXCHANGE = f"dom_med_bench_{tag}"
    settings.REDIS_KEY_PREFIX = f"bench-{tag}"
    settings.OUTBOX_WAKE_KEY = f"bench-{tag}:outbox:wake"
    cleanup()
    truncate()
    transport = get_transport("rabbitmq")
    transport.setup_topology()
    transport.close()

    results = {}
    try:
        if args.only in (None, "rabbitmq"):
            results["rabbitmq"] = bench_rabbitmq(args.rows, args.batch, args.rounds)
            print("rabbitmq", json.dumps(results["rabbitmq"]), flush=True)
        if args.only in (None, "sqs"):
            results["sqs"] = bench_sqs(args.sqs_rows, args.batch)
            print("sqs", json.dumps(results["sqs"]), flush=True)
        if args.only in (None, "latency"):
            for wake in (True, False):
                name = "latency_wake" if wake else "latency_sweep_only"
                results[name] = bench_latency(
                    args.latency_count, args.rate, wake=wake, sweep=settings.RELAY_SWEEP_INTERVAL
                )
                print(name, json.dumps(results[name]), flush=True)
        if args.only in (None, "history"):
            results["history"] = bench_history(args.rows, args.history, args.batch)
            print("history", json.dumps(results["history"]), flush=True)
    finally:
        truncate()
        cleanup()


if __name__ == "__main__":
    main()
