"""Fixtures for the worker runtime: short timings, per-test queues, a relay and workers
running in threads against the real broker (RabbitMQ, or moto's SQS on loopback).

Messages are fed the real way: ``dispatch`` writes outbox rows, the relay's engine
delivers them.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connection, transaction

from broker import get_dead_letter_box
from outbox.models import PlatformOutboxMessage, TaskRun
from outbox.runs import RunLedger, Started
from outbox.services import dispatch
from relay.engine import OutboxRelay
from tests.broker_queues import delete_queues
from tests.polling import wait_until
from tests.worker import tasks as test_tasks  # registers the test handlers
from worker.builders import build_task_worker

ROOT = Path(__file__).resolve().parents[2]
RETRY = {"max_receives": 5, "backoff_seconds": 0.4, "backoff_max_seconds": 1.6}


@pytest.fixture(scope="session")
def test_catalog(tmp_path_factory) -> Path:
    """tasks.json plus the tests' own task (tasks.json itself stays untouched)."""
    catalog = json.loads((ROOT / "tasks.json").read_text())
    catalog["tasks"].append(
        {"name": "test.work", "queue": "default", "retry": RETRY, "description": "tests"}
    )
    for queue in ("critical", "bulk", "maintenance"):
        # The same handler on the other queue classes (a worker consuming several).
        catalog["tasks"].append(
            {"name": f"test.work.{queue}", "queue": queue, "retry": RETRY, "description": "tests"}
        )
    catalog["tasks"].append(
        {"name": "test.limited", "queue": "default", "retry": RETRY, "time_limit_seconds": 1}
    )
    path = tmp_path_factory.mktemp("catalog") / "tasks.json"
    path.write_text(json.dumps(catalog))
    return path


@pytest.fixture(autouse=True)
def worker_settings(settings, exchange_name, test_catalog):
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    settings.TASKS_CATALOG = test_catalog
    settings.RELAY_SWEEP_INTERVAL = 0.1
    settings.WORKER_VISIBILITY_TIMEOUT = 2
    settings.WORKER_HEARTBEAT_INTERVAL = 0.5
    settings.WORKER_SQS_WAIT_SECONDS = 1
    settings.WORKER_RABBITMQ_HEARTBEAT = 2
    url = settings.RABBITMQ_URL
    yield settings
    delete_queues(url)


@pytest.fixture(params=["rabbitmq", "sqs"])
def broker(request, settings) -> str:
    settings.BROKER = request.param
    if request.param == "sqs":
        settings.SQS_ENDPOINT_URL = request.getfixturevalue("moto_endpoint")
    return request.param


class BackgroundRelay:
    """The relay's engine in a thread: delivers what is due, sweeping every 50 ms."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="relay", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        relay = OutboxRelay()
        try:
            relay.transport.setup_topology()
            while not self._stop.is_set():
                if not relay.relay_one_batch():
                    self._stop.wait(0.05)
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            relay.close()
            connection.close()

    def start(self) -> BackgroundRelay:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


@pytest.fixture
def relay(broker):
    background = BackgroundRelay().start()
    yield background
    background.stop()
    assert background.error is None, background.error


class WorkerThread:
    """The background worker ``run_worker`` runs (``build_task_worker``), in a thread."""

    def __init__(self, *, concurrency: int = 2, stop_budget: float = 5.0, queues=("default",)):
        built = build_task_worker(
            list(queues), concurrency=concurrency, stop_budget=stop_budget, poll_interval=0.05
        )
        self.consumer = built.consumer
        self.processor = built.processor
        self.worker = built.loop
        self._thread = threading.Thread(target=self._run, name="worker", daemon=True)
        self.error: BaseException | None = None

    def _run(self) -> None:
        try:
            self.worker.run()
        except BaseException as exc:
            self.error = exc
            raise
        finally:
            connection.close()

    def start(self) -> WorkerThread:
        self._thread.start()
        assert self.worker.wait_until_ready(15), "the worker never became ready"
        return self

    def stop(self) -> None:
        self.worker.stop()
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "the worker did not stop"


@pytest.fixture
def start_worker(broker):
    started: list[WorkerThread] = []

    def start(**kwargs) -> WorkerThread:
        worker = WorkerThread(**kwargs).start()
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()
        assert worker.error is None, worker.error


@pytest.fixture
def start_workers(broker):
    """Several workers (as separate processes would be: a connection each), started at
    the same moment."""
    started: list[WorkerThread] = []

    def start(count: int, **kwargs) -> list[WorkerThread]:
        workers = [WorkerThread(**kwargs) for _ in range(count)]
        started.extend(workers)
        for worker in workers:
            worker._thread.start()
        for worker in workers:
            assert worker.worker.wait_until_ready(15), "a worker never became ready"
        return workers

    yield start
    for worker in started:
        worker.stop()
        assert worker.error is None, worker.error


def outcomes(workers, name: str) -> int:
    """How many deliveries the workers settled with this outcome (``busy``, ...)."""
    return sum(worker.processor.outcomes[name] for worker in workers)


def go_ahead(run_id: str) -> None:
    """Let a task waiting for the test's go-ahead finish."""
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        client.set(test_tasks.go_ahead_key(run_id), "1", ex=3600)
    finally:
        client.close()


def send_again(run_id: str, *, wait: bool = True) -> None:
    """The relay sends the same outbox row again (as after a crash between its send and
    its commit): a second copy of the message, a new message to the broker. ``wait``:
    until it is sent (not for a copy a worker may turn away at once, re-arming the row)."""
    PlatformOutboxMessage.objects.filter(run_id=run_id).update(sent_at=None)
    if wait:
        wait_for(
            lambda: PlatformOutboxMessage.objects.get(run_id=run_id).sent_at is not None,
            what="the copy to be sent",
        )


def dispatch_work(**payload) -> str:
    with transaction.atomic():
        return str(dispatch("test.work", payload))


def wait_for(condition: Callable[[], object], timeout: float = 30.0, what: str = "") -> object:
    """``wait_until`` with the worker tests' bound: a delivery may wait out a backoff."""
    return wait_until(condition, timeout=timeout, message=what)


def claim(ledger: RunLedger, envelope: dict, *, holder: str, lease: float) -> Started:
    """One run claimed as the worker claims its window's, by ``RunLedger.begin_many``."""
    return ledger.begin_many([(envelope, holder, lease)])[holder]


def run_of(run_id: str) -> TaskRun:
    return TaskRun.objects.get(run_id=run_id)


def run_finished(run_id: str) -> bool:
    return run_of(run_id).status in (TaskRun.Status.SUCCEEDED, TaskRun.Status.FAILED)


def executions(run_id: str) -> list[tuple[int, float]]:
    """(receive count, time) of each run of the test handler for this run."""
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        raw = client.lrange(test_tasks.executions_key(run_id), 0, -1)
    finally:
        client.close()
    pairs = [item.decode().split(":") for item in raw]
    return [(int(count), float(at)) for count, at in pairs]


def dead_letters(destination: str = "default"):
    box = get_dead_letter_box()
    try:
        return box.peek(destination, 100)
    finally:
        box.close()


def worker_environment(**extra: object) -> dict[str, str]:
    """The environment of a ``manage.py run_worker`` subprocess sharing this test's
    database, broker names, Redis prefix and short timings."""
    env = dict(os.environ)
    s = django_settings
    env.update(
        DJANGO_SETTINGS_MODULE="tests.worker.settings",
        DATABASE_URL=f"postgres://{s.DATABASES['default']['USER'] or 'postgres'}@"
        f"{s.DATABASES['default']['HOST']}:{s.DATABASES['default']['PORT']}/"
        f"{s.DATABASES['default']['NAME']}",
        TASKS_CATALOG=str(s.TASKS_CATALOG),
        BROKER=s.BROKER,
        SQS_ENDPOINT_URL=s.SQS_ENDPOINT_URL or "",
        QUEUE_PREFIX=s.QUEUE_PREFIX,
        RABBITMQ_EXCHANGE=s.RABBITMQ_EXCHANGE,
        REDIS_KEY_PREFIX=s.REDIS_KEY_PREFIX,
        WORKER_VISIBILITY_TIMEOUT=str(s.WORKER_VISIBILITY_TIMEOUT),
        WORKER_HEARTBEAT_INTERVAL=str(s.WORKER_HEARTBEAT_INTERVAL),
        WORKER_SQS_WAIT_SECONDS=str(s.WORKER_SQS_WAIT_SECONDS),
        WORKER_RABBITMQ_HEARTBEAT=str(s.WORKER_RABBITMQ_HEARTBEAT),
        PYTHONUNBUFFERED="1",
    )
    env.update({name: str(value) for name, value in extra.items()})
    return env


def worker_command(*args: str) -> list[str]:
    return [sys.executable, str(ROOT / "manage.py"), "run_worker", *args]
