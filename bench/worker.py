"""Worker throughput: no-op tasks per second through one worker process, per transport,
as a ratio to the raw consume-and-ack rate of the same broker in the same run.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_runtime \\
        .venv/bin/python bench/worker.py [--rabbitmq N] [--sqs N] [--concurrency C] \\
        [--rounds R]

The database must be migrated (``manage.py migrate``). SQS is moto's server on loopback,
started here. Messages are fed the real way (dispatch, then the relay's engine) before
the clock starts; the worker's figure includes its bookkeeping in ``task_runs`` (two
single-statement commits per task: the claim, then the success mark) and one ack per
message. The clock stops when the worker has settled every message (counted in memory,
checked in the database afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
import uuid
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

from broker import topology  # noqa: E402
from broker.sqs.publisher import sqs_client  # noqa: E402
from outbox.handlers import task  # noqa: E402
from outbox.models import TaskRun  # noqa: E402
from outbox.services import dispatch  # noqa: E402
from relay.engine import OutboxRelay  # noqa: E402
from worker.builders import build_task_worker  # noqa: E402


@task("bench.noop")
def noop(message) -> None:
    return None


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
    return run_ids


def raw_rabbitmq(count: int, prefetch: int) -> float:
    """Messages per second of a bare pika consumer acking each message."""
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=prefetch)
    started = time.perf_counter()
    consumed = channel.consume(topology.queue_name("default"))
    for seen, (method, _properties, _body) in enumerate(consumed, start=1):
        channel.basic_ack(method.delivery_tag)
        if seen == count:
            break
    elapsed = time.perf_counter() - started
    channel.cancel()
    conn.close()
    return count / elapsed


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


def through_worker(run_ids: list[str], concurrency: int) -> float:
    built = build_task_worker(
        ["default"], concurrency=concurrency, stop_budget=5, poll_interval=0.05
    )
    processor, worker = built.processor, built.loop
    started = time.perf_counter()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    # Watched in memory (a query per look would compete for the same two cores).
    while processor.outcomes["succeeded"] < len(run_ids):
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    worker.stop()
    thread.join(timeout=30)
    done = TaskRun.objects.filter(run_id__in=run_ids, status=TaskRun.Status.SUCCEEDED).count()
    assert done == len(run_ids), f"only {done} of {len(run_ids)} runs succeeded"
    return len(run_ids) / elapsed


def bench(broker: str, count: int, concurrency: int, rounds: int) -> None:
    """``rounds`` times: the raw rate, then the worker's, on fresh queues; each round's
    figures, then the medians (the machine is shared: single runs vary)."""
    raws, ours = [], []
    for round_number in range(1, rounds + 1):
        settings.BROKER = broker
        settings.QUEUE_PREFIX = f"bench-{uuid.uuid4().hex[:6]}-"
        feed(count)
        raw = raw_rabbitmq(count, concurrency) if broker == "rabbitmq" else raw_sqs(count)
        run_ids = feed(count)
        worker = through_worker(run_ids, concurrency)
        cleanup(broker)
        raws.append(raw)
        ours.append(worker)
        print(
            f"{broker:8} round {round_number}: messages={count} concurrency={concurrency} "
            f"raw consume+ack={raw:8.0f}/s  worker={worker:8.0f}/s  ratio={worker / raw:.2f}"
        )
    raw, worker = statistics.median(raws), statistics.median(ours)
    ratios = sorted(w / r for w, r in zip(ours, raws, strict=True))
    print(
        f"{broker:8} median of {rounds}: raw consume+ack={raw:8.0f}/s  worker={worker:8.0f}/s  "
        f"ratio={statistics.median(ratios):.2f} (per round {ratios[0]:.2f}-{ratios[-1]:.2f})"
    )


def cleanup(broker: str) -> None:
    if broker == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        channel = conn.channel()
        channel.queue_delete(topology.queue_name("default"))
        channel.queue_delete(topology.dead_letter_queue_name("default"))
        for queue_class in ("critical", "bulk", "maintenance"):
            channel.queue_delete(topology.queue_name(queue_class))
            channel.queue_delete(topology.dead_letter_queue_name(queue_class))
        conn.close()


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
    parser.add_argument("--rounds", type=int, default=3, help="measurements per transport")
    args = parser.parse_args()

    catalog = json.loads((ROOT / "tasks.json").read_text())
    catalog["tasks"].append({"name": "bench.noop", "queue": "default"})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(catalog, handle)
    settings.TASKS_CATALOG = handle.name
    settings.RABBITMQ_EXCHANGE = f"dom_med_bench_{uuid.uuid4().hex[:6]}"
    try:
        if args.rabbitmq:
            bench("rabbitmq", args.rabbitmq, args.concurrency, args.rounds)
        if args.sqs:
            settings.SQS_ENDPOINT_URL = start_moto()
            bench("sqs", args.sqs, args.concurrency, args.rounds)
    finally:
        os.unlink(handle.name)
        if args.rabbitmq:
            conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
            conn.channel().exchange_delete(settings.RABBITMQ_EXCHANGE)
            conn.close()
        with connection.cursor() as cursor:
            cursor.execute(
                "DELETE FROM platform_outbox_messages WHERE envelope->>'task' = 'bench.noop'"
            )
            cursor.execute("DELETE FROM task_runs WHERE task = 'bench.noop'")


if __name__ == "__main__":
    main()
