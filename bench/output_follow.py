"""Following a job's output live: how soon a line reaches its followers, what they cost.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/hub_follow_bench \
        .venv/bin/python bench/output_follow.py

Two real servers, as the Procfile runs them: the API (gunicorn, ``hubdommed.wsgi``,
``WEB_CONCURRENCY=2``) and the stream process (uvicorn, ``hubdommed.asgi``). A writer sends
the job's output as its worker does, ``POST /api/v1/jobs/{id}/output`` on the API with the
worker's credential, one chunk (one line) every ``--interval`` seconds, ``--chunks`` of
them; beside it, one client asks ``GET /api/v1/me`` (a tenant member's token) every 20 ms.
Each round runs these, in an order that alternates from round to round:

- no follower (the writer and ``/me`` alone: the quiet reference);
- 1 follower of the job on the stream process (``GET /jobs/{id}/output/stream``);
- ``--followers`` followers of the job on the stream process;
- ``--followers`` followers spread over ``--jobs`` jobs on the stream process (the writer's
  chunks go to the jobs in turn, so each job gets one chunk in ``--jobs``);
- 1 client polling ``GET /jobs/{id}/output?offset=`` every second on the API, what a user
  would write without the stream;
- ``--followers`` followers of the job on the API process itself, which answers with the log
  as it is now and ``retry: 1000``: each follower asks again a second after each answer.

For each: a line's latency, from the moment the writer sends its chunk to the moment a
follower reads it (p50/p99 over every line and follower); ``GET /me``'s p50/p99 and its
ratio to the no-follower run of the same round; the most database connections the stream
process and the API held meanwhile (``pg_stat_activity``, by ``PGAPPNAME``); the CPU the
stream process and this client used while the writer wrote (percent of one core). The table
gives the median over rounds of each.

A line's latency is also given from the moment the API answered the writer's ``POST``
(the chunk committed and its wake published): what the follower's own path costs.

The followers are threads of this process (``tests.sse.Follower``): a line's arrival is
stamped when the thread reads it, so a busy client adds its own delay to the figures.

The database must be one of its own (its name must contain ``bench``): created and
migrated if needed, emptied at the start and at the end. Its Redis keys have a prefix of
the run's own (``bench-follow-``), deleted at the end. A figure taken at a load average
above 2 does not count (``--allow-load`` measures anyway and says so). ``--smoke`` is a
short form that proves the command works (one round, 20 chunks, 5 followers).
"""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
RUN = uuid.uuid4().hex[:6]
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "hubdommed.settings")
os.environ.setdefault("LOG_LEVEL", "warning")
# The servers inherit these (tests.processes): the same keys, prefix and secrets as here.
os.environ["REDIS_KEY_PREFIX"] = f"bench-follow-{RUN}"
os.environ["QUEUE_PREFIX"] = f"bench-follow-{RUN}-"
os.environ["RABBITMQ_EXCHANGE"] = f"bench-follow-{RUN}"
# One token for the whole run.
os.environ["ACCESS_TOKEN_SECONDS"] = "86400"
# Served as in production: no DEBUG (which keeps every query in memory, among others).
os.environ["DEBUG"] = "false"
os.environ["SECRET_KEY"] = f"bench-{uuid.uuid4().hex}"
# Without DEBUG the webhook secrets need a key of their own: a new one per run.
os.environ["WEBHOOK_SECRET_KEYS"] = base64.urlsafe_b64encode(os.urandom(32)).decode()
os.environ["ALLOWED_HOSTS"] = "127.0.0.1"

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from bench.load import Rounds, add_load_arguments, load_note, require_quiet  # noqa: E402
from identity.tokens import issue_access_token  # noqa: E402
from job.services import job_complete  # noqa: E402
from outbox.wake import redis_client  # noqa: E402
from tests.factories import RunningJobFactory, UserFactory, WorkerFactory  # noqa: E402
from tests.servers import api_server, stop_all, stream_server  # noqa: E402
from tests.sse import Follower  # noqa: E402

HOST = "127.0.0.1"
STREAM = "/api/v1/jobs/{id}/output/stream"
OUTPUT = "/api/v1/jobs/{id}/output"
ME_EVERY = 0.02
STREAM_APP = f"bench-follow-stream-{RUN}"
API_APP = f"bench-follow-api-{RUN}"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def request(port: int, method: str, path: str, token: str, body: dict | None = None):
    conn = http.client.HTTPConnection(HOST, port, timeout=30)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        payload = None
        if body is not None:
            headers["Content-Type"] = "application/json"
            payload = json.dumps(body).encode()
        conn.request(method, path, body=payload, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def lines_of(text: str, at: float, into: dict[int, float]) -> None:
    """Each ``chunk N`` line of ``text``, first read at ``at``."""
    for line in text.splitlines():
        if line.startswith("chunk "):
            into.setdefault(int(line.split()[1]), at)


@dataclass
class Job:
    """A running job with its worker, as the writer and the followers see it."""

    pk: int
    worker: object
    claim_token: uuid.UUID
    credential: str
    seq: int = 0

    @classmethod
    def create(cls, tenant) -> Job:
        job = RunningJobFactory(tenant=tenant)
        worker = WorkerFactory(automation=job.automation)
        return cls(job.pk, worker, job.claim_token, worker.credential)

    def finish(self) -> None:
        job_complete(worker=self.worker, job_id=self.pk, claim_token=self.claim_token, result=None)


class Poller:
    """``GET /jobs/{id}/output?offset=`` every second, from the last ``next_offset``."""

    def __init__(self, port: int, job_id: int, token: str) -> None:
        self.port, self.job_id, self.token = port, job_id, token
        self.received: dict[int, float] = {}
        self.offset = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="poller")

    def start(self) -> Poller:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            path = f"{OUTPUT.format(id=self.job_id)}?offset={self.offset}"
            status, body = request(self.port, "GET", path, self.token)
            at = time.time()
            if status == 200:
                page = json.loads(body)
                lines_of(page["text"], at, self.received)
                self.offset = page["next_offset"]
            next_at += 1.0
            self._stop.wait(max(0.0, next_at - time.monotonic()))


class MeProbe:
    """``GET /api/v1/me`` every ``ME_EVERY`` seconds, one request at a time."""

    def __init__(self, port: int, token: str) -> None:
        self.port, self.token = port, token
        self.durations: list[float] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="me-probe")

    def start(self) -> MeProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            began = time.perf_counter()
            status, body = request(self.port, "GET", "/api/v1/me", self.token)
            self.durations.append((time.perf_counter() - began) * 1000)
            if status != 200:
                self.failures.append(f"{status} {body[:200]!r}")
            self._stop.wait(ME_EVERY)


@dataclass
class Outcome:
    latencies: list[float] = field(default_factory=list)  # ms, every line and follower
    after_answer: list[float] = field(default_factory=list)  # the same, from the POST's answer
    missing: int = 0
    me: list[float] = field(default_factory=list)
    stream_connections: int = 0
    api_connections: int = 0
    stream_cpu: float = 0.0  # the stream process's CPU time over the writer's run, in percent
    client_cpu: float = 0.0  # this process's (the followers, the writer, /me)


def cpu_seconds(pid: int | None = None) -> float:
    """User and system CPU time of process ``pid`` (this one by default), in seconds."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def connections_of(application: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [application]
        )
        return cursor.fetchone()[0]


@dataclass
class Bench:
    api: object
    stream: object
    tenant: object
    token: str
    chunks: int
    interval: float
    followers: int
    jobs: int

    def scenarios(self) -> dict[str, Callable[[], Outcome]]:
        n, j = self.followers, self.jobs
        return {
            "no follower": lambda: self.run(jobs=1, followers=0),
            "1 follower, stream process": lambda: self.run(jobs=1, followers=1),
            f"{n} followers of one job, stream process": lambda: self.run(jobs=1, followers=n),
            f"{n} followers over {j} jobs, stream process": lambda: self.run(jobs=j, followers=n),
            "1 client polling GET /output every 1 s, API": lambda: self.run(
                jobs=1, followers=0, poll=True
            ),
            f"{n} followers on the API process (retry 1 s)": lambda: self.run(
                jobs=1, followers=n, on_api=True
            ),
        }

    def run(self, *, jobs: int, followers: int, poll: bool = False, on_api: bool = False):
        server = self.api if on_api else self.stream
        headers = {"Authorization": f"Bearer {self.token}"}
        targets = [Job.create(self.tenant) for _ in range(jobs)]
        # An EventSource waits ``retry`` (1000 ms) before it asks the API process again.
        pause = settings.JOB_OUTPUT_FOLLOW_RETRY_MS / 1000 if on_api else 0.2
        readers = [
            (
                targets[slot % jobs],
                Follower(
                    f"{server.url}{STREAM.format(id=targets[slot % jobs].pk)}",
                    headers,
                    pause=pause,
                ).start(),
            )
            for slot in range(followers)
        ]
        poller = Poller(self.api.port, targets[0].pk, self.token).start() if poll else None
        wait_for(lambda: all(f.connections for _, f in readers), "followers connected", 30)
        # Each stream is subscribed to its job's wakes before the first chunk is sent.
        time.sleep(0.5)
        outcome = Outcome()
        sent: dict[int, float] = {}
        answered: dict[int, float] = {}
        expected: dict[int, int] = {}  # chunk -> job pk
        probe = MeProbe(self.api.port, self.token).start()
        began = time.monotonic()
        cpu_before = cpu_seconds(self.stream.process.pid), cpu_seconds()
        for number in range(self.chunks):
            target = targets[number % jobs]
            time.sleep(max(0.0, began + number * self.interval - time.monotonic()))
            sent[number] = time.time()
            expected[number] = target.pk
            status, body = request(
                self.api.port,
                "POST",
                OUTPUT.format(id=target.pk),
                target.credential,
                {
                    "claim_token": str(target.claim_token),
                    "seq": target.seq,
                    "text": f"chunk {number}\n",
                },
            )
            answered[number] = time.time()
            if status >= 300:
                raise SystemExit(f"POST /output failed: {status} {body[:300]!r}")
            target.seq += 1
            if number == self.chunks // 2:
                outcome.stream_connections = connections_of(STREAM_APP)
                outcome.api_connections = connections_of(API_APP)

        wall = time.monotonic() - began
        outcome.stream_cpu = (cpu_seconds(self.stream.process.pid) - cpu_before[0]) / wall * 100
        outcome.client_cpu = (cpu_seconds() - cpu_before[1]) / wall * 100

        def received(follower) -> dict[int, float]:
            got: dict[int, float] = {}
            for event in list(follower.events):
                if event.name == "output":
                    lines_of(event.json["text"], event.received_at, got)
            return got

        wanted = {
            id(follower): {n for n, pk in expected.items() if pk == target.pk}
            for target, follower in readers
        }
        wait_for(
            lambda: (
                all(wanted[id(f)] <= received(f).keys() for _, f in readers)
                and (poller is None or set(sent) <= poller.received.keys())
            ),
            "every line read",
            15,
            fail=False,
        )
        probe.stop()
        if probe.failures:
            raise SystemExit(f"GET /me failed: {probe.failures[0]}")
        outcome.me = probe.durations
        outcome.stream_connections = max(outcome.stream_connections, connections_of(STREAM_APP))
        outcome.api_connections = max(outcome.api_connections, connections_of(API_APP))
        for _, follower in readers:
            got = received(follower)
            for number in wanted[id(follower)]:
                if number in got:
                    outcome.latencies.append((got[number] - sent[number]) * 1000)
                    outcome.after_answer.append((got[number] - answered[number]) * 1000)
                else:
                    outcome.missing += 1
        if poller is not None:
            poller.stop()
            for number, at in poller.received.items():
                outcome.latencies.append((at - sent[number]) * 1000)
                outcome.after_answer.append((at - answered[number]) * 1000)
            outcome.missing += len(set(sent) - poller.received.keys())
        for target in targets:
            target.finish()
        # The end event closes each stream; a follower on the API reads it at its next ask.
        wait_for(lambda: all(f.ended.is_set() for _, f in readers), "streams ended", 10, fail=False)
        for _, follower in readers:
            follower.stop()
        return outcome


def wait_for(check: Callable[[], bool], what: str, timeout: float, *, fail: bool = True) -> None:
    gives_up_at = time.monotonic() + timeout
    while not check():
        if time.monotonic() > gives_up_at:
            if fail:
                raise SystemExit(f"gave up waiting for {what} after {timeout:g} s")
            print(f"  (still waiting for {what} after {timeout:g} s: counted as missing)")
            return
        time.sleep(0.05)


def measure(bench: Bench, rounds: int) -> None:
    scenarios = bench.scenarios()
    results: dict[str, list[Outcome]] = {name: [] for name in scenarios}
    ratios: dict[str, list[float]] = {name: [] for name in scenarios}
    # Warm both servers (imports, connections, the stream process's subscription).
    bench.run(jobs=1, followers=1)
    begun = Rounds()
    for number in range(rounds):
        order = list(scenarios) if number % 2 == 0 else list(reversed(scenarios))
        print(f"round {number + 1} ({begun.start()}):", flush=True)
        for name in order:
            outcome = scenarios[name]()
            results[name].append(outcome)
            latency = (
                f"p50 {percentile(outcome.latencies, 0.5):.0f} ms "
                f"p99 {percentile(outcome.latencies, 0.99):.0f} ms"
                if outcome.latencies
                else "-"
            )
            print(
                f"  {name}: line {latency}, missing {outcome.missing}; /me p50 "
                f"{percentile(outcome.me, 0.5):.1f} ms p99 {percentile(outcome.me, 0.99):.1f} ms; "
                f"connections stream {outcome.stream_connections} api {outcome.api_connections}; "
                f"CPU stream {outcome.stream_cpu:.0f}% client {outcome.client_cpu:.0f}%",
                flush=True,
            )
        quiet = percentile(results["no follower"][-1].me, 0.5)
        for name in scenarios:
            ratios[name].append(percentile(results[name][-1].me, 0.5) / quiet)

    # Lines lost count in every round, whatever the load; the medians are the counting
    # rounds' alone.
    missing = {name: sum(o.missing for o in results[name]) for name in scenarios}
    results = {name: begun.kept(outcomes) for name, outcomes in results.items()}
    ratios = {name: begun.kept(values) for name, values in ratios.items()}

    def median_of(name: str, figure: Callable[[Outcome], float]) -> float:
        return statistics.median(figure(outcome) for outcome in results[name])

    print(
        f"\n{rounds} rounds, {bench.chunks} chunks {bench.interval * 1000:.0f} ms apart each; "
        f"medians over {begun.note()}"
    )
    print(
        "| who follows | line p50 ms | line p99 ms | p50 from the POST's answer | missing "
        "| /me p50 ms | /me p99 ms "
        "| /me p50 vs no follower | DB connections: stream / API | CPU: stream / client |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in scenarios:
        if results[name][0].latencies:
            line = (
                f"{median_of(name, lambda o: percentile(o.latencies, 0.5)):.0f} "
                f"| {median_of(name, lambda o: percentile(o.latencies, 0.99)):.0f} "
                f"| {median_of(name, lambda o: percentile(o.after_answer, 0.5)):.0f}"
            )
        else:
            line = "- | - | -"
        print(
            f"| {name} | {line} | {missing[name]} "
            f"| {median_of(name, lambda o: percentile(o.me, 0.5)):.1f} "
            f"| {median_of(name, lambda o: percentile(o.me, 0.99)):.1f} "
            f"| {statistics.median(ratios[name]):.2f} "
            f"(rounds: {', '.join(f'{r:.2f}' for r in ratios[name])}) "
            f"| {median_of(name, lambda o: o.stream_connections):.0f} "
            f"/ {median_of(name, lambda o: o.api_connections):.0f} "
            f"| {median_of(name, lambda o: o.stream_cpu):.0f}% "
            f"/ {median_of(name, lambda o: o.client_cpu):.0f}% |",
            flush=True,
        )
    print(f"({load_note()} at the end)")


def empty_database() -> None:
    call_command("flush", interactive=False, verbosity=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--chunks", type=int, default=200, help="chunks a run writes")
    parser.add_argument("--interval", type=float, default=0.1, help="seconds between chunks")
    parser.add_argument("--followers", type=int, default=50)
    parser.add_argument("--jobs", type=int, default=10, help="jobs the spread followers follow")
    parser.add_argument("--smoke", action="store_true", help="1 round, 20 chunks, 5 followers")
    add_load_arguments(parser)
    args = parser.parse_args()
    require_quiet(args)
    if args.smoke:
        args.rounds, args.chunks, args.followers, args.jobs = 1, 20, 5, 2

    name = settings.DATABASES["default"]["NAME"]
    if "bench" not in name:
        raise SystemExit(f"refusing to empty {name!r}: give DATABASE_URL a *bench* database")
    subprocess.run([sys.executable, "scripts/ensure_database.py"], cwd=ROOT, check=True)
    call_command("migrate", verbosity=0)
    empty_database()
    logs = Path(tempfile.mkdtemp(prefix="bench-follow-"))
    measured = False
    api = api_server(settings, logs, PGAPPNAME=API_APP, WEB_CONCURRENCY="2")
    stream = stream_server(settings, logs, PGAPPNAME=STREAM_APP)
    try:
        api.start()
        stream.start()
        person = UserFactory()
        bench = Bench(
            api=api,
            stream=stream,
            tenant=person.tenant,
            token=issue_access_token(person).token,
            chunks=args.chunks,
            interval=args.interval,
            followers=args.followers,
            jobs=args.jobs,
        )
        measure(bench, args.rounds)
        measured = True
    finally:
        stop_all(stream, api)
        empty_database()
        client = redis_client()
        keys = list(client.scan_iter(f"{settings.REDIS_KEY_PREFIX}*"))
        if keys:
            client.delete(*keys)
        if measured:
            shutil.rmtree(logs, ignore_errors=True)
        else:
            print(f"(the servers' logs are in {logs})")


if __name__ == "__main__":
    main()
