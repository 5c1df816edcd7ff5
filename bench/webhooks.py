"""Webhook deliveries: how many per second reach receivers that answer at once (against a
bare HTTP client), and what one receiver that never answers does to the other tenants'
delivery latency.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_webhook_bench \\
        .venv/bin/python bench/webhooks.py [--deliveries N] [--rounds K] [--rate R] \\
        [--seconds S] [--concurrency C]

The database is created and migrated if needed. The relay (``manage.py run_relay``) and
one background worker (``manage.py run_worker --queues default``) run as real processes, with
broker names and a Redis prefix of this run's own; the receivers are HTTP servers on loopback
in this process (``WEBHOOK_ALLOW_PRIVATE_ADDRESSES=true``), the timeouts are the production
defaults.

1. Throughput, K interleaved rounds: N JobCompleted events of four tenants, each with one
   endpoint, committed in one transaction, the clock running from the commit to the last
   delivery received; then, in the same round, a bare client: urllib3 (the library the hub
   uses) with connections kept alive, C threads posting N bodies of the same size to the
   same four receivers, with none of the hub's bookkeeping. Each round prints the machine's
   load at its start; the medians and the median ratio close the section.
2. Isolation: R events per second for S seconds to the four tenants' receivers, and as many
   again to a fifth tenant's; latency from each of the four's events' commit to its arrival
   at the receiver. Once with a fifth receiver that answers at once, then with one that
   accepts the connection and never answers (same load, so the difference is the silence).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TAG = uuid.uuid4().hex[:6]
# Shared with the relay and worker processes started below.
RUN_ENV = {
    "QUEUE_PREFIX": f"bench-wh-{TAG}-",
    "RABBITMQ_EXCHANGE": f"dom_med_bench_wh_{TAG}",
    "REDIS_KEY_PREFIX": f"bench-wh-{TAG}",
    "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
    "BROKER": "rabbitmq",
    "LOG_LEVEL": "warning",
}
os.environ.update(RUN_ENV)
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")

import django  # noqa: E402

django.setup()

import pika  # noqa: E402
import urllib3  # noqa: E402
from django.conf import settings  # noqa: E402
from django.db import transaction  # noqa: E402

from automation.models import Automation  # noqa: E402
from bench.database import ensure_migrated  # noqa: E402
from bench.load import Rounds, add_load_arguments, load_note, require_quiet  # noqa: E402
from broker import topology  # noqa: E402
from identity.models import Tenant  # noqa: E402
from job.models import Job  # noqa: E402
from outbox.services import publish  # noqa: E402
from sector.models import Sector  # noqa: E402
from webhook.models import WebhookAttempt, WebhookDelivery, WebhookEndpoint  # noqa: E402
from webhook.services import endpoint_create  # noqa: E402

HEALTHY_TENANTS = 4


class Receiver:
    """Records when each event arrived (by the event id in the body); ``hang``: never answers."""

    def __init__(self, *, hang: bool = False) -> None:
        self.arrivals: dict[int, float] = {}
        self.lock = threading.Lock()
        self.release = threading.Event()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                arrived = time.time()
                if hang:
                    receiver.release.wait()
                    return
                event_id = int(body.split(b'"event_id":', 1)[1].split(b",", 1)[0])
                with receiver.lock:
                    receiver.arrivals.setdefault(event_id, arrived)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()


class Tenancy:
    """A tenant, an automation, one job to report on, and one endpoint to its receiver."""

    def __init__(self, receiver: Receiver, sector: Sector) -> None:
        tag = uuid.uuid4().hex[:8]
        self.tenant = Tenant.objects.create(name=f"Bench {tag}", slug=f"bench-{tag}")
        automation = Automation.objects.create(
            name=f"Bench {tag}", slug=f"bench-{tag}", sector=sector, command=["true"]
        )
        self.job = Job.objects.create(tenant=self.tenant, automation=automation, status="succeeded")
        self.endpoint = endpoint_create(
            tenant=self.tenant, url=receiver.url, event_types=["JobCompleted"], actor=None
        )
        self.receiver = receiver

    def publish(self) -> int:
        """One JobCompleted (inside the caller's transaction); its event id."""
        payload = {"job_id": self.job.pk, "automation_id": self.job.automation_id}
        return publish("JobCompleted", payload, tenant=self.tenant, aggregate=self.job).event_id


def start_daemons(concurrency: int, log_dir: Path) -> list[subprocess.Popen]:
    env = {**os.environ, **RUN_ENV, "HUBDOMMED_RELAY": "true"}
    manage = [sys.executable, str(ROOT / "manage.py")]
    subprocess.run([*manage, "setup_broker"], env=env, check=True, capture_output=True)
    # The processes keep their log files open for their whole life.
    relay = subprocess.Popen(
        [*manage, "run_relay"],
        env=env,
        stdout=open(log_dir / "relay.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    worker = subprocess.Popen(
        [*manage, "run_worker", "--queues", "default", "--concurrency", str(concurrency)],
        env=env,
        stdout=open(log_dir / "worker.log", "w"),  # noqa: SIM115
        stderr=subprocess.STDOUT,
    )
    return [relay, worker]


def wait_for(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def arrived_all(expected: list[tuple[Tenancy, int]]):
    """A cheap check that every expected event reached its receiver (the receivers share
    this process: a check that walks everything each time would slow them down)."""
    waiting = list(expected)

    def check() -> bool:
        nonlocal waiting
        waiting = [(t, e) for t, e in waiting if e not in t.receiver.arrivals]
        return not waiting

    return check


_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system) a process has used so far; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / _TICKS


class CpuMeter:
    """CPU time used by the relay, the worker and this benchmark's database sessions (the
    server processes of its database: PostgreSQL runs on this machine) between ``start``
    and ``stop``: what the hub's deliveries cost in CPU, however loaded the machine is."""

    def __init__(self, daemons: list[subprocess.Popen]) -> None:
        self.relay, self.worker = (process.pid for process in daemons)

    def _backends(self) -> list[int]:
        from django.db import connection

        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                "AND pid <> pg_backend_pid()"
            )
            return [pid for (pid,) in cursor.fetchall()]

    def _sample(self) -> dict[str, dict[int, float]]:
        return {
            "relay": {self.relay: _cpu_seconds(self.relay)},
            "worker": {self.worker: _cpu_seconds(self.worker)},
            "database": {pid: _cpu_seconds(pid) for pid in self._backends()},
        }

    def start(self) -> None:
        self.started = self._sample()

    def stop(self) -> dict[str, float]:
        ended = self._sample()
        return {
            part: sum(max(0.0, cpu - self.started[part].get(pid, 0.0)) for pid, cpu in pids.items())
            for part, pids in ended.items()
        }


def throughput(tenancies: list[Tenancy], count: int, cpu: CpuMeter | None = None) -> float:
    expected: list[tuple[Tenancy, int]] = []
    with transaction.atomic():
        for number in range(count):
            tenancy = tenancies[number % len(tenancies)]
            expected.append((tenancy, tenancy.publish()))
    if cpu is not None:
        cpu.start()
    committed = time.time()

    if not wait_for(arrived_all(expected), timeout=600):
        raise SystemExit("not every delivery arrived within 10 minutes")
    last = max(t.receiver.arrivals[event_id] for t, event_id in expected)
    first = min(t.receiver.arrivals[event_id] for t, event_id in expected)
    elapsed = last - committed
    event_ids = [event_id for _, event_id in expected]
    # The attempt is recorded just after the receiver answered.
    wait_for(
        lambda: WebhookAttempt.objects.filter(delivery__event_id__in=event_ids).count() >= count,
        timeout=30,
    )
    latencies = list(
        WebhookAttempt.objects.filter(
            delivery__endpoint__in=[t.endpoint for t in tenancies],
            delivery__event_id__in=[e for _, e in expected],
        ).values_list("latency_ms", flat=True)
    )
    print(
        f"  hub:  {count} deliveries to {len(tenancies)} receivers in {elapsed:.2f} s = "
        f"{count / elapsed:.0f}/s (the first {(first - committed) * 1000:.0f} ms after the "
        f"commit); HTTP request p50 {statistics.median(latencies):.0f} ms, "
        f"p95 {percentile(latencies, 95):.0f} ms"
    )
    if cpu is not None:
        used = cpu.stop()
        print(
            "        CPU a delivery: "
            + ", ".join(f"{part} {seconds / count * 1e6:.0f} us" for part, seconds in used.items())
            + f" (together {sum(used.values()) / count * 1e6:.0f} us)"
        )
    return count / elapsed


# Event ids of the bare client's bodies: far above the hub's, so the receivers tell them apart.
_bare_ids = itertools.count(10**12)


def bare(tenancies: list[Tenancy], count: int, concurrency: int) -> float:
    """``count`` POSTs to the same receivers by ``concurrency`` threads with kept connections
    (urllib3, as the hub), bodies and headers of a delivery's size; deliveries per second."""
    body_template = WebhookDelivery.objects.filter(
        endpoint__in=[t.endpoint for t in tenancies]
    ).values_list("body", flat=True)[0]
    pools = [
        urllib3.HTTPConnectionPool(
            "127.0.0.1", int(t.receiver.url.split(":")[2].split("/")[0]), maxsize=concurrency
        )
        for t in tenancies
    ]
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "HubDomMed-Webhooks/1",
        "webhook-id": "msg_" + "0" * 32,
        "webhook-timestamp": str(int(time.time())),
        "webhook-signature": "v1," + "A" * 44,
    }
    jobs = [(number % len(tenancies), next(_bare_ids)) for number in range(count)]
    lock = threading.Lock()
    errors: list[BaseException] = []

    def post() -> None:
        while True:
            with lock:
                if not jobs:
                    return
                which, event_id = jobs.pop()
            body = body_template.replace('"event_id":', f'"event_id":{event_id},"was":', 1)
            try:
                pools[which].urlopen(
                    "POST", "/hook", body=body.encode(), headers=headers, retries=False
                )
            except Exception as exc:  # counted, and the first one reported
                errors.append(exc)

    started = time.time()
    cpu_started = time.process_time()
    threads = [threading.Thread(target=post) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.time() - started
    # The receivers' share too: they run in this process.
    cpu_used = time.process_time() - cpu_started
    for pool in pools:
        pool.close()
    if errors:
        raise SystemExit(f"the bare client failed {len(errors)} requests: {errors[0]!r}")
    print(
        f"  bare: {count} POSTs to {len(tenancies)} receivers in {elapsed:.2f} s = "
        f"{count / elapsed:.0f}/s (urllib3, {concurrency} threads, kept connections); CPU a "
        f"POST {cpu_used / count * 1e6:.0f} us, the receivers' included"
    )
    return count / elapsed


def steady(tenancies: list[Tenancy], fifth: Tenancy, rate: float, seconds: float) -> list[float]:
    """``rate`` events per second to the four tenants, and as many to ``fifth`` (so that both
    runs carry the same load); the four tenants' delivery latencies, in ms."""
    sent: list[tuple[Tenancy, int, float]] = []
    interval = 1.0 / rate
    started = time.monotonic()
    number = 0
    while time.monotonic() - started < seconds:
        tenancy = tenancies[number % len(tenancies)]
        with transaction.atomic():
            event_id = tenancy.publish()
            fifth.publish()
        sent.append((tenancy, event_id, time.time()))
        number += 1
        time.sleep(max(0.0, started + number * interval - time.monotonic()))

    if not wait_for(arrived_all([(t, e) for t, e, _ in sent]), timeout=120):
        missing = sum(event_id not in t.receiver.arrivals for t, event_id, _ in sent)
        raise SystemExit(f"{missing} healthy deliveries never arrived")
    return [(t.receiver.arrivals[event_id] - at) * 1000 for t, event_id, at in sent]


def percentile(values, pct: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * pct / 100))]


def describe(label: str, latencies: list[float]) -> None:
    print(
        f"{label:34} n={len(latencies):4}  p50 {statistics.median(latencies):6.0f} ms  "
        f"p95 {percentile(latencies, 95):6.0f} ms  p99 {percentile(latencies, 99):6.0f} ms  "
        f"max {max(latencies):6.0f} ms"
    )


def cleanup(daemons: list[subprocess.Popen], receivers: list[Receiver]) -> None:
    # The hung tenant's deliveries would go on retrying: its endpoint ends them.
    WebhookEndpoint.objects.filter(url__in=[r.url for r in receivers]).update(status="disabled")
    for process in daemons:
        process.terminate()
    for process in daemons:
        try:
            process.wait(timeout=40)
        except subprocess.TimeoutExpired:
            process.kill()
    for receiver in receivers:
        receiver.close()
    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        for destination in topology.QUEUES:
            channel.queue_delete(topology.queue_name(destination))
            channel.queue_delete(topology.dead_letter_queue_name(destination))
        channel.exchange_delete(settings.RABBITMQ_EXCHANGE)
    finally:
        conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deliveries", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved throughput rounds")
    parser.add_argument("--rate", type=float, default=20.0, help="healthy events per second")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--concurrency", type=int, default=settings.WORKER_CONCURRENCY)
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    ensure_migrated()

    sector = Sector.objects.create(name=f"Bench {TAG}", slug=f"bench-{TAG}")
    receivers = [Receiver() for _ in range(HEALTHY_TENANTS)]
    fifth_receiver = Receiver()
    hung_receiver = Receiver(hang=True)
    tenancies = [Tenancy(receiver, sector) for receiver in receivers]
    log_dir = Path(os.environ.get("BENCH_LOG_DIR") or tempfile.mkdtemp(prefix="bench-webhooks-"))
    print(f"relay and worker logs in {log_dir}")
    daemons = start_daemons(args.concurrency, log_dir)
    cpu = CpuMeter(daemons)
    try:
        print(
            f"worker concurrency {args.concurrency}; timeouts connect "
            f"{settings.WEBHOOK_CONNECT_TIMEOUT} s, read {settings.WEBHOOK_READ_TIMEOUT} s, "
            f"whole request {settings.WEBHOOK_TIMEOUT} s"
        )
        # A first delivery per receiver warms the daemons up (connections, imports).
        throughput(tenancies, len(tenancies))
        hub_rates, bare_rates, ratios = [], [], []
        begun = Rounds()
        for number in range(1, args.rounds + 1):
            print(f"round {number} ({begun.start()} at its start)")
            hub_rates.append(throughput(tenancies, args.deliveries, cpu))
            bare_rates.append(bare(tenancies, args.deliveries, args.concurrency))
            ratios.append(hub_rates[-1] / bare_rates[-1])
            print(f"  ratio hub/bare {ratios[-1]:.2f}")
        # The summary: the rounds that count alone.
        hub_rates, bare_rates, ratios = (
            begun.kept(hub_rates),
            begun.kept(bare_rates),
            begun.kept(ratios),
        )
        print(
            f"throughput, median of {begun.note()}: hub {statistics.median(hub_rates):.0f}"
            f"/s, bare client {statistics.median(bare_rates):.0f}/s; ratio median "
            f"{statistics.median(ratios):.2f} (range {min(ratios):.2f}-{max(ratios):.2f})"
        )
        print(f"isolation ({load_note()} at its start)")
        alone = steady(tenancies, Tenancy(fifth_receiver, sector), args.rate, args.seconds)
        hung = Tenancy(hung_receiver, sector)
        beside = steady(tenancies, hung, args.rate, args.seconds)
        describe("fifth receiver answers at once", alone)
        describe("fifth receiver never answers", beside)
        hung_attempts = WebhookAttempt.objects.filter(delivery__endpoint=hung.endpoint).count()
        print(
            f"the silent receiver: {hung_attempts} attempts made (each timing out after "
            f"{settings.WEBHOOK_READ_TIMEOUT} s); the rest of its deliveries waited their turn"
        )
    finally:
        cleanup(daemons, [*receivers, fifth_receiver, hung_receiver])


if __name__ == "__main__":
    main()
