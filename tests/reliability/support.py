"""The pieces every reliability scenario is built from.

The system runs as real processes (``gunicorn``, ``manage.py run_relay`` …) on loopback,
against a database of the scenario's own (a copy of a migrated template, or one on a
private PostgreSQL cluster) and broker names of its own. The test process only drives
traffic over HTTP, breaks things, and counts: in the database with plain SQL, and on the
broker with a consumer of its own.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pika
import pika.exceptions
import psycopg
import requests

from tests.polling import wait_until
from tests.ports import free_port
from tests.processes import wait_until_it_handles

ROOT = Path(__file__).resolve().parents[2]
FULL = os.environ.get("CHAOS", "").strip().lower() == "full"
FIGURES_DIR = ROOT / "var" / "reliability"


def scaled(quick, full):
    """The quick figure (``make test``) or the full one (``make chaos``, ``CHAOS=full``)."""
    return full if FULL else quick


def wait_for(
    condition: Callable[[], object],
    *,
    timeout: float,
    what: str | Callable[[], str],
    every: float = 0.1,
) -> object:
    """``tests.polling.wait_until`` in the scenarios' words: fail naming ``what``."""
    return wait_until(condition, timeout=timeout, interval=every, message=what)


# -- figures ---------------------------------------------------------------------------------


@dataclass
class Figures:
    """One scenario's outcome: the line it prints and what it keeps for the docs."""

    scenario: str
    sent: int = 0
    delivered: int = 0
    duplicates: int = 0
    lost: int = 0
    recovery_seconds: float | None = None
    extra: dict[str, object] = field(default_factory=dict)

    def line(self) -> str:
        recovery = "-" if self.recovery_seconds is None else f"{self.recovery_seconds:.2f} s"
        text = (
            f"{self.scenario}: sent={self.sent} delivered={self.delivered} "
            f"duplicates={self.duplicates} lost={self.lost} recovery={recovery}"
        )
        details = " ".join(f"{key}={_short(value)}" for key, value in self.extra.items())
        return f"{text} {details}".strip()

    def as_dict(self) -> dict[str, object]:
        return {
            "scenario": self.scenario,
            "mode": "full" if FULL else "quick",
            "sent": self.sent,
            "delivered": self.delivered,
            "duplicates": self.duplicates,
            "lost": self.lost,
            "recovery_seconds": self.recovery_seconds,
            **self.extra,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value).replace(" ", "")


class FigureBook:
    """Collects the figures of a test session: printed at the end, kept as JSON."""

    def __init__(self) -> None:
        self.figures: list[Figures] = []

    def record(self, figures: Figures, tmp_path: Path | None = None) -> None:
        self.figures.append(figures)
        print(f"\n[reliability] {figures.line()}", flush=True)
        data = figures.as_dict()
        if tmp_path is not None:
            (tmp_path / "figures.json").write_text(json.dumps(data, indent=2))
        # One file per scenario: two runs at once (the soak beside the rest) never
        # rewrite each other's.
        directory = FIGURES_DIR / str(data["mode"])
        directory.mkdir(parents=True, exist_ok=True)
        slug = "".join(c if c.isalnum() else "-" for c in figures.scenario.lower())
        (directory / f"{slug}.json").write_text(json.dumps(data, indent=2))


BOOK = FigureBook()


# -- the database ----------------------------------------------------------------------------


class Database:
    """A database the scenario's processes use, read by the test with plain SQL."""

    def __init__(self, url: str) -> None:
        self.url = url

    def rows(self, sql: str, params: Iterable[object] = ()) -> list[tuple]:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            return conn.execute(sql, list(params)).fetchall()

    def value(self, sql: str, params: Iterable[object] = ()) -> object:
        rows = self.rows(sql, params)
        return rows[0][0] if rows else None

    def execute(self, sql: str, params: Iterable[object] = ()) -> None:
        with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
            conn.execute(sql, list(params))

    def reachable(self) -> bool:
        try:
            self.value("SELECT 1")
        except psycopg.Error:
            return False
        return True

    # What the scenarios count.

    def pending_rows(self) -> int:
        return int(
            self.value(
                "SELECT (SELECT count(*) FROM outbox_messages WHERE sent_at IS NULL)"
                " + (SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NULL)"
            )
        )

    def pending_summary(self, limit: int = 10) -> str:
        """The unsent rows, a line each: what a failed wait for none of them shows."""
        rows = self.rows(
            """
            SELECT table_name, queue, attempts,
                   round(extract(epoch FROM available_at - clock_timestamp())::numeric, 1),
                   left(envelope::text, 160)
              FROM (SELECT 'outbox_messages' AS table_name, queue, attempts, available_at,
                           envelope
                      FROM outbox_messages WHERE sent_at IS NULL
                    UNION ALL
                    SELECT 'platform_outbox_messages', queue, attempts, available_at, envelope
                      FROM platform_outbox_messages WHERE sent_at IS NULL) AS pending
             ORDER BY available_at
             LIMIT %s
            """,
            [limit],
        )
        return "\n".join(
            f"{table} queue={queue} attempts={attempts} due_in={due}s {envelope}"
            for table, queue, attempts, due, envelope in rows
        )

    def oldest_pending_age(self) -> float:
        """Seconds the oldest due, unsent row has waited (0 when none)."""
        return float(
            self.value(
                """
                SELECT coalesce(extract(epoch FROM clock_timestamp() - min(available_at)), 0)
                  FROM (SELECT available_at FROM outbox_messages
                         WHERE sent_at IS NULL AND available_at <= clock_timestamp()
                        UNION ALL
                        SELECT available_at FROM platform_outbox_messages
                         WHERE sent_at IS NULL AND available_at <= clock_timestamp()) AS due
                """
            )
        )

    def now(self) -> object:
        return self.value("SELECT clock_timestamp()")

    def sent_since(self, moment: object) -> bool:
        """Whether the relay marked a row sent after ``moment`` (the database's clock)."""
        return bool(
            self.value(
                "SELECT EXISTS (SELECT 1 FROM outbox_messages WHERE sent_at > %s)"
                " OR EXISTS (SELECT 1 FROM platform_outbox_messages WHERE sent_at > %s)",
                [moment, moment],
            )
        )

    def delivered_after(self, moment: object) -> bool:
        """The relay has sent a row committed after ``moment`` (the database's clock)."""
        return bool(
            self.value(
                "SELECT EXISTS (SELECT 1 FROM outbox_messages"
                " WHERE created_at > %s AND sent_at IS NOT NULL)",
                [moment],
            )
        )

    def executed_after(self, moment: object) -> bool:
        """The worker has started a run of ``chaos.effect`` created after ``moment``."""
        return bool(
            self.value(
                "SELECT EXISTS (SELECT 1 FROM reliability_executions e"
                " JOIN task_runs r ON r.run_id = e.run_id WHERE r.created_at > %s)",
                [moment],
            )
        )

    def job_created_run_ids(self, *, but: str = "") -> set[str]:
        """The run ids of every message ``JobCreated`` caused (one per subscriber), except
        those of the task ``but``."""
        rows = self.rows(
            "SELECT run_id::text FROM outbox_messages"
            " WHERE envelope->>'event' = 'JobCreated' AND envelope->>'task' <> %s",
            [but],
        )
        return {run_id for (run_id,) in rows}


def admin_url(url: str) -> str:
    return url.rsplit("/", 1)[0] + "/postgres"


def create_database(url: str, *, template: str | None = None) -> None:
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(admin_url(url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        suffix = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{suffix}')


def drop_database(url: str) -> None:
    name = url.rsplit("/", 1)[1]
    with (
        contextlib.suppress(psycopg.Error),
        psycopg.connect(admin_url(url), autocommit=True, connect_timeout=5) as conn,
    ):
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def migrate(url: str, **env: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--no-input", "-v", "0"],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, **env},
        check=True,
        timeout=240,
    )


# -- the processes ---------------------------------------------------------------------------


CATALOG_TASK = {
    "name": "chaos.effect",
    "queue": "default",
    "retry": {"max_receives": 5, "backoff_seconds": 0.5, "backoff_max_seconds": 2},
    "description": "reliability tests: an effect recorded once per run",
}


def reliability_catalog(directory: Path, subscribes: Iterable[str] = ()) -> Path:
    """tasks.json plus the reliability tests' own task (subscribed to ``subscribes``: a run
    of it for each such event)."""
    catalog = json.loads((ROOT / "tasks.json").read_text())
    catalog["tasks"].append({**CATALOG_TASK, "subscribes": list(subscribes)})
    path = directory / "tasks.json"
    path.write_text(json.dumps(catalog))
    return path


class Stack:
    """The system's processes for one scenario; every one is stopped at the end."""

    def __init__(
        self,
        directory: Path,
        *,
        database_url: str,
        rabbitmq_url: str | None = None,
        redis_url: str | None = None,
        effect_subscribes: Iterable[str] = (),
        **extra: object,
    ) -> None:
        self.directory = directory
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.machines = directory / "machines"
        self.machines.mkdir(exist_ok=True)
        self.database = Database(database_url)
        tag = uuid.uuid4().hex[:8]
        self.queue_prefix = f"rel-{tag}-"
        self.exchange = f"dom_med_rel_{tag}"
        self.env: dict[str, str] = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.reliability.settings",
            "TASKS_CATALOG": str(reliability_catalog(directory, effect_subscribes)),
            "DATABASE_URL": database_url,
            "BROKER": "rabbitmq",
            "QUEUE_PREFIX": self.queue_prefix,
            "RABBITMQ_EXCHANGE": self.exchange,
            "REDIS_KEY_PREFIX": f"rel-{tag}",
            "LOCAL_MACHINES_DIR": str(self.machines),
            "ACCESS_TOKEN_SECONDS": str(6 * 3600),
            "LOG_LEVEL": "info",
            "PYTHONUNBUFFERED": "1",
        }
        if rabbitmq_url:
            self.env["RABBITMQ_URL"] = rabbitmq_url
        if redis_url:
            self.env["REDIS_URL"] = redis_url
        self.env.update({name: str(value) for name, value in extra.items()})
        self.processes: dict[str, subprocess.Popen] = {}
        self.api_url: str | None = None
        self._broker_names_deleted = False

    @property
    def rabbitmq_url(self) -> str:
        from django.conf import settings

        return self.env.get("RABBITMQ_URL") or settings.RABBITMQ_URL

    def start(self, name: str, *args: str, **env: object) -> subprocess.Popen:
        """``manage.py args`` (or any command, when ``args[0]`` is a path) as ``name``."""
        self.stop(name, kill=True)
        command = list(args) if args[0].startswith("/") else [sys.executable, "manage.py", *args]
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child writes it)
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env={**self.env, **{key: str(value) for key, value in env.items()}},
            stdout=log,
            stderr=subprocess.STDOUT,
            # A process group of its own: a kill reaches its children (gunicorn's workers,
            # an agent's command) and never the test.
            start_new_session=True,
        )
        log.close()
        self.processes[name] = process
        return process

    def api(self, workers: int = 3, **env: object) -> str:
        port = free_port()
        self.start(
            "api",
            str(Path(sys.executable).parent / "gunicorn"),
            "hubdommed.wsgi:application",
            "--bind",
            f"127.0.0.1:{port}",
            "--workers",
            str(workers),
            "--timeout",
            "60",
            **env,
        )
        self.api_url = f"http://127.0.0.1:{port}"
        wait_for(
            self._api_up, timeout=60, what=lambda: f"the API to listen\n{self.log_tail('api')}"
        )
        return self.api_url

    def _api_up(self) -> bool:
        try:
            return requests.get(f"{self.api_url}/health/live", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def relay(self, name: str = "relay", **env: object) -> subprocess.Popen:
        env.setdefault("RELAY_SWEEP_INTERVAL", "0.5")
        return self.start(name, "run_relay", HUBDOMMED_RELAY="true", **env)

    def wait_for_relay(self, timeout: float = 60) -> None:
        """Until the relay is up: it has sent the hourly purge, due at its first start."""
        wait_for(
            lambda: self.database.value(
                "SELECT count(*) FROM platform_outbox_messages WHERE sent_at IS NOT NULL"
            ),
            timeout=timeout,
            what=lambda: f"the relay to start\n{self.log_tail('relay')}",
        )

    def worker(self, *args: str, name: str = "worker", **env: object) -> subprocess.Popen:
        return self.start(name, "run_worker", *args, **env)

    def monitor(self, interval: float = 1.0, **env: object) -> subprocess.Popen:
        return self.start("monitor", "watch_stuck_jobs", "--interval", str(interval), **env)

    def agent(self, slug: str, credential: str, **env: object) -> subprocess.Popen:
        env.setdefault("AGENT_POLL_INTERVAL", "0.5")
        env.setdefault("AGENT_IDLE_TIMEOUT", "0")
        return self.start(
            f"agent-{slug}",
            "run_worker",
            "--automation",
            slug,
            HUBDOMMED_WORKER_CREDENTIAL=credential,
            HUB_URL=self.api_url or "",
            # It needs no database: one it cannot reach shows any use.
            DATABASE_URL="postgres://nobody@127.0.0.1:9/no_database",
            **env,
        )

    def signal(self, name: str, signum: int) -> None:
        """SIGKILL takes the process's group with it; other signals go to it alone."""
        self.signal_process(self.processes[name], signum)

    def alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def stop(self, name: str, *, kill: bool = False, timeout: float = 15) -> int | None:
        process = self.processes.pop(name, None)
        if process is None:
            return None
        if process.poll() is None:
            self.signal_process(process, signal.SIGKILL if kill else signal.SIGTERM)
            try:
                process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.signal_process(process, signal.SIGKILL)
                process.wait(timeout=10)
        # Whatever it left behind in its group (a stray child) goes too.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        return process.returncode

    @staticmethod
    def signal_process(process: subprocess.Popen, signum: int) -> None:
        """SIGKILL to the group; another signal to the process once it handles that signal
        (signalled before, a daemon still starting dies by it instead of stopping)."""
        with contextlib.suppress(ProcessLookupError):
            if signum == signal.SIGKILL:
                os.killpg(process.pid, signum)
            else:
                with contextlib.suppress(TimeoutError):
                    wait_until_it_handles(process, signum, timeout=30)
                process.send_signal(signum)

    def close(self) -> None:
        for name in list(self.processes):
            self.stop(name)
        # Automation workers the local provider started are detached: their pid files.
        for pid_file in self.machines.glob("*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError, PermissionError):
                os.killpg(int(pid_file.read_text().strip()), signal.SIGKILL)
        if "RABBITMQ_URL" not in self.env and not self._broker_names_deleted:
            self._delete_broker_names()
            self._broker_names_deleted = True

    def _delete_broker_names(self) -> None:
        """Remove every queue and the exchange the scenario's daemons may have declared on
        the shared broker (a private node goes with its test): each destination of the
        topology, and each automation's, of the automations in the scenario's database."""
        from broker.topology import QUEUES

        destinations = list(QUEUES)
        with contextlib.suppress(psycopg.Error):
            destinations += [
                f"automation-{id_}" for (id_,) in self.database.rows("SELECT id FROM automations")
            ]
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            connection = pika.BlockingConnection(pika.URLParameters(self.rabbitmq_url))
            try:
                channel = connection.channel()
                for destination in destinations:
                    channel.queue_delete(f"{self.queue_prefix}{destination}")
                    channel.queue_delete(f"{self.queue_prefix}{destination}-dlq")
                channel.exchange_delete(self.exchange)
            finally:
                connection.close()

    def log_tail(self, *names: str, chars: int = 3000) -> str:
        paths = [self.logs / f"{n}.log" for n in names] if names else sorted(self.logs.glob("*"))
        paths += sorted(self.machines.glob("*.log"))
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-chars:]}" for p in paths if p.exists()
        )

    def rss_kib(self, name: str, *, children: bool = True) -> int:
        """Resident memory of a process, with its children (gunicorn's workers), in KiB."""
        pid = self.processes[name].pid
        return sum(rss_kib(p) for p in (process_tree(pid) if children else [pid]))


def process_tree(pid: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children[int(fields[1])].append(int(stat.parent.name))
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, []))
    return tree


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# -- the catalog, through the code's own services ----------------------------------------------


@dataclass(frozen=True)
class Seeded:
    token: str
    automation_id: int
    slug: str
    credential: str


def seed(stack: Stack, **automation: object) -> Seeded:
    """A tenant, a person with an access token, and an automation (with its worker)."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.seed", json.dumps(automation)],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Seeded(**json.loads(result.stdout.strip().splitlines()[-1]))


def dispatch_effects(stack: Stack, payloads: list[dict]) -> list[str]:
    """Runs of ``chaos.effect`` committed to the outbox in one transaction; their run ids."""
    result = subprocess.run(
        [sys.executable, "-m", "tests.reliability.seed", "--dispatch", json.dumps(payloads)],
        cwd=ROOT,
        env=stack.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# -- traffic over HTTP -----------------------------------------------------------------------


class JobTraffic:
    """Client threads creating jobs through the API, each request answered or counted failed.

    ``total``: stop after that many requests; ``rate``: requests per second over all
    threads (None: as fast as the API answers).
    """

    def __init__(
        self,
        api_url: str,
        seeded: Seeded,
        *,
        threads: int = 4,
        total: int | None = None,
        rate: float | None = None,
        params: Callable[[int], dict] | None = None,
    ) -> None:
        self.url = f"{api_url}/api/v1/jobs"
        self.seeded = seeded
        self.total = total
        self.rate = rate
        self.params = params or (lambda n: {"n": n})
        self._lock = threading.Lock()
        self._issued = 0
        self._stop = threading.Event()
        self._paused = threading.Event()
        # No request past this many is issued until the gate moves (``hold_after``).
        self._gate: int | None = None
        self._gate_moved = threading.Condition(self._lock)
        self.statuses: collections.Counter = collections.Counter()
        self.failures: list[str] = []
        self.job_ids: list[int] = []
        self.last_created_at: float | None = None
        # (monotonic time sent, seconds to its answer) of each created job.
        self.latencies: list[tuple[float, float]] = []
        self._threads = [
            threading.Thread(target=self._run, name=f"traffic-{i}", daemon=True)
            for i in range(threads)
        ]
        self.started_at = 0.0

    @property
    def sent(self) -> int:
        return sum(self.statuses.values())

    @property
    def created(self) -> int:
        return self.statuses[201]

    def start(self) -> JobTraffic:
        self.started_at = time.monotonic()
        for thread in self._threads:
            thread.start()
        return self

    def _next(self) -> int | None:
        with self._lock:
            while self._gate is not None and self._issued >= self._gate:
                if self._stop.is_set():
                    return None
                self._gate_moved.wait(0.05)
            if self._stop.is_set() or (self.total is not None and self._issued >= self.total):
                return None
            self._issued += 1
            n = self._issued
        if self.rate:
            delay = self.started_at + n / self.rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        return n

    def _run(self) -> None:
        session = requests.Session()
        session.headers["Authorization"] = f"Bearer {self.seeded.token}"
        try:
            while True:
                while self._paused.is_set() and not self._stop.is_set():
                    time.sleep(0.05)
                n = self._next()
                if n is None:
                    return
                body = {"automation": self.seeded.automation_id, "params": self.params(n)}
                sent_at = time.monotonic()
                try:
                    response = session.post(self.url, json=body, timeout=60)
                except requests.RequestException as exc:
                    self._count("error", f"{type(exc).__name__}: {exc}"[:300])
                    continue
                if response.status_code == 201:
                    answered_at = time.monotonic()
                    with self._lock:
                        self.statuses[201] += 1
                        self.job_ids.append(response.json()["id"])
                        self.last_created_at = answered_at
                        self.latencies.append((sent_at, answered_at - sent_at))
                else:
                    self._count(response.status_code, response.text[:300])
        finally:
            session.close()

    def _count(self, status: object, text: str) -> None:
        with self._lock:
            self.statuses[status] += 1
            if len(self.failures) < 50:
                self.failures.append(f"{status}: {text}")

    def latency_p95(self, since: float, until: float) -> float:
        """p95 seconds of the requests sent between two monotonic times."""
        return self.latency_quantile(since, until, 0.95)

    def latency_quantile(self, since: float, until: float, q: float) -> float:
        """The ``q`` quantile, in seconds, of the requests sent between two monotonic times."""
        with self._lock:
            took = sorted(t for at, t in self.latencies if since <= at < until)
        assert took, "no request answered in that time"
        return took[min(len(took) - 1, int(len(took) * q))]

    def pause(self) -> None:
        self._paused.set()

    def hold_after(self, requests: int | None) -> None:
        """Issue no request past the first ``requests`` until called again (None: no
        limit): a scenario that acts while the traffic runs keeps some traffic for after
        each of its actions, however fast the API answers."""
        with self._lock:
            self._gate = requests
            self._gate_moved.notify_all()

    def wait_sent(self, requests: int, timeout: float) -> None:
        """Until ``requests`` requests were answered (or counted failed)."""
        deadline = time.monotonic() + timeout
        while self.sent < requests:
            assert time.monotonic() < deadline, f"{self.sent} of {requests} requests answered"
            time.sleep(0.01)

    def resume(self) -> None:
        self._paused.clear()

    def stop(self) -> None:
        self._stop.set()
        self.join()

    def join(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            if thread.ident is not None:  # started
                thread.join(max(0.1, deadline - time.monotonic()))
        assert not any(t.is_alive() for t in self._threads), "client threads did not finish"

    def done(self) -> bool:
        return not any(t.is_alive() for t in self._threads)


class LagProbe:
    """Samples the age of the oldest due, unsent row (the outbox's lag) in a thread."""

    def __init__(self, stack: Stack, every: float = 0.1) -> None:
        self.stack = stack
        self.every = every
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(self.stack.database.oldest_pending_age())

    def start(self) -> LagProbe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LagProbe:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def worst(self) -> float:
        return max(self.samples, default=0.0)

    @property
    def p50(self) -> float:
        return self._quantile(0.5)

    @property
    def p95(self) -> float:
        return self._quantile(0.95)

    def _quantile(self, q: float) -> float:
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


# -- what reaches the broker -----------------------------------------------------------------


class BrokerAudit:
    """A consumer of the scenario's queues that counts every message by its run id.

    It reconnects by itself (the broker may be the thing being broken; ``url`` may list a
    cluster's nodes, comma-separated, tried in that order), counts a message
    the broker delivers again after a lost ack (``redelivered``) apart from a second copy
    the relay published, and acks in small batches.
    """

    def __init__(self, url: str, queues: Callable[[], list[str]]) -> None:
        self.url = url
        self.queues = queues
        self.copies: collections.Counter = collections.Counter()
        self.redelivered = 0
        self.cancellations = 0
        self.arrivals: list[float] = []
        self._first_arrival: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.connected = threading.Event()
        self._thread = threading.Thread(target=self._run, name="broker-audit", daemon=True)

    def start(self) -> BrokerAudit:
        # Its reconnection attempts while the queues or the broker are missing are expected.
        logging.getLogger("pika").setLevel(logging.CRITICAL)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    @property
    def seen(self) -> set[str]:
        with self._lock:
            return set(self.copies)

    @property
    def last_arrival(self) -> float | None:
        with self._lock:
            return self.arrivals[-1] if self.arrivals else None

    def arrival(self, run_id: str) -> float:
        """When the first copy of a run id arrived."""
        with self._lock:
            return self._first_arrival[run_id]

    def duplicates(self) -> int:
        with self._lock:
            return sum(count - 1 for count in self.copies.values() if count > 1)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._consume()
            except (pika.exceptions.AMQPError, OSError, AssertionError):
                self.connected.clear()
                self._stop.wait(0.3)

    def _consume(self) -> None:
        nodes = [pika.URLParameters(node) for node in self.url.split(",")]
        for params in nodes:
            params.connection_attempts = 1
            params.socket_timeout = 2
        connection = pika.BlockingConnection(nodes)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=500)
            queues = self.queues()
            for queue in queues:
                # Passive: the relay declares them; until it has, try again.
                channel.queue_declare(queue, passive=True)
            cancelled: list[object] = []
            # The broker may cancel a consumer (its queue's leader moved): consume again.
            channel.add_on_cancel_callback(cancelled.append)
            for queue in queues:
                channel.basic_consume(queue, self._on_message)
            self.connected.set()
            while not self._stop.is_set() and not cancelled:
                connection.process_data_events(time_limit=0.2)
            self.cancellations += len(cancelled)
        finally:
            self.connected.clear()
            with contextlib.suppress(Exception):
                connection.close()

    def _on_message(self, channel, method, properties, _body) -> None:
        with self._lock:
            if method.redelivered and properties.message_id in self.copies:
                # The broker's own redelivery of what we already counted (our ack was lost).
                self.redelivered += 1
            else:
                self.copies[properties.message_id] += 1
                now = time.monotonic()
                self.arrivals.append(now)
                self._first_arrival.setdefault(properties.message_id, now)
        channel.basic_ack(method.delivery_tag)

    def wait_for(
        self, expected: set[str], *, timeout: float, what: str | Callable[[], str]
    ) -> float:
        """Until every expected run id has arrived; returns when the last one did."""
        wait_for(lambda: expected <= self.seen, timeout=timeout, what=what, every=0.05)
        return time.monotonic()


def job_queues(stack: Stack, automation_id: int) -> Callable[[], list[str]]:
    """Where ``JobCreated`` sends its two messages: power-on (critical) and the
    automation's own queue."""
    return lambda: [
        f"{stack.queue_prefix}critical",
        f"{stack.queue_prefix}automation-{automation_id}",
    ]
