"""An attempt whose worker died is known dead at once: its database session, and the lock
the attempt holds on it, end with the process. A real ``run_worker`` is SIGKILLed in the
middle of an attempt to a receiver that does not answer; the endpoint's next delivery goes
out within seconds, not after the dead attempt's whole budget. Killed in the middle of a
run of many deliveries, the run's rest comes back with its lease, each delivered."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter

import pytest
from django.db import connection, transaction

from tests.broker_queues import delete_queues
from tests.polling import wait_until
from tests.webhook.conftest import Reply
from tests.webhook.test_delivery import complete_a_job
from tests.worker.conftest import ROOT, BackgroundRelay, WorkerThread
from webhook import delivery as engine
from webhook.models import WebhookDelivery, WebhookEndpoint

pytestmark = pytest.mark.django_db(transaction=True)

# Long enough that waiting the dead attempt out (its budget: WEBHOOK_TIMEOUT + 5 s) could
# not pass for knowing it dead.
TIMEOUT = 30.0
NEXT_DELIVERY_BOUND = 5.0


@pytest.fixture
def broker_names(settings, exchange_name):
    settings.BROKER = "rabbitmq"
    settings.QUEUE_PREFIX = f"{settings.QUEUE_PREFIX}{uuid.uuid4().hex[:6]}-"
    settings.RABBITMQ_EXCHANGE = exchange_name
    settings.RELAY_SWEEP_INTERVAL = 0.1
    settings.WORKER_HEARTBEAT_INTERVAL = 0.5
    settings.WORKER_RABBITMQ_HEARTBEAT = 2
    settings.WEBHOOK_READ_TIMEOUT = TIMEOUT
    settings.WEBHOOK_TIMEOUT = TIMEOUT
    yield settings
    delete_queues(settings.RABBITMQ_URL)


def worker_process(settings, ready_file, visibility: int = 60) -> subprocess.Popen:
    db = settings.DATABASES["default"]
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "hubdommed.settings",
        "DATABASE_URL": f"postgres://{db['USER'] or 'postgres'}@{db['HOST']}:{db['PORT']}/"
        f"{db['NAME']}",
        "BROKER": "rabbitmq",
        "QUEUE_PREFIX": settings.QUEUE_PREFIX,
        "RABBITMQ_EXCHANGE": settings.RABBITMQ_EXCHANGE,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
        "WEBHOOK_READ_TIMEOUT": str(TIMEOUT),
        "WEBHOOK_TIMEOUT": str(TIMEOUT),
        # The killed worker's run stays leased for a minute: only the endpoint's own
        # knowledge of the dead attempt lets the next delivery through sooner.
        "WORKER_VISIBILITY_TIMEOUT": str(visibility),
        "WORKER_READY_FILE": str(ready_file),
        "PYTHONUNBUFFERED": "1",
    }
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_worker", "--queues", "default"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_a_worker_killed_mid_attempt_frees_its_endpoint_within_seconds(
    broker_names, receiver, make_endpoint, tenant, tmp_path
):
    # The first request is never answered; every later one at once.
    receiver.script(Reply(delay=3600))
    endpoint = make_endpoint(receiver.url)
    relay = BackgroundRelay().start()
    ready_file = tmp_path / "worker.ready"
    process = worker_process(broker_names, ready_file)
    second: WorkerThread | None = None
    try:
        wait_until(ready_file.exists, timeout=30, message="the worker to be ready")
        complete_a_job(tenant)
        wait_until(lambda: receiver.requests(), timeout=30, message="the first attempt")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        second = WorkerThread(concurrency=2).start()

        complete_a_job(tenant)
        made = time.monotonic()
        wait_until(
            lambda: len(receiver.requests()) >= 2,
            timeout=TIMEOUT + 10,
            message="the endpoint's next delivery",
        )
        waited = time.monotonic() - made
    finally:
        if process.poll() is None:
            process.kill()
        if second is not None:
            second.stop()
        relay.stop()
        connection.close()

    assert waited < NEXT_DELIVERY_BOUND, f"the next delivery went out after {waited:.1f} s"
    first, later = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id")
    assert WebhookDelivery.objects.get(pk=later.pk).status == "delivered"
    # Only the in-doubt attempt may be made again; the next delivery went out once.
    ids = [request.headers["webhook-id"] for request in receiver.requests()]
    assert ids.count(later.message_id) == 1
    assert set(ids) <= {first.message_id, later.message_id}


def test_an_attempt_in_flight_on_a_live_session_still_holds_its_endpoint(
    receiver, make_endpoint, tenant
):
    # The guard's other half: a live attempt (its lock held) defers the next one.
    make_endpoint(receiver.url)
    complete_a_job(tenant)
    complete_a_job(tenant)
    first, later = WebhookDelivery.objects.order_by("id")
    first.attempt_started_at = later.created_at
    first.save(update_fields=["attempt_started_at"])
    engine._hold_attempt(first.pk)
    try:
        outcome = engine.delivery_attempt(delivery_id=later.pk, run_id=later.scheduled_run_id)
    finally:
        engine._let_go_attempt(first.pk)

    assert outcome is engine.Outcome.DEFERRED
    assert receiver.requests() == []


def test_a_worker_killed_in_the_middle_of_a_run_leaves_its_rest_to_the_runs_lease(
    broker_names, receiver, make_endpoint, tenant, tmp_path
):
    endpoint = make_endpoint(receiver.url)
    # The endpoint answered fast before: its run begins its deliveries in batches.
    WebhookEndpoint.objects.filter(pk=endpoint.pk).update(answers_fast=True)
    # The run's first delivery is answered, the second never (the worker dies at it).
    receiver.script(Reply(), Reply(delay=3600))
    with transaction.atomic():
        for _ in range(5):
            complete_a_job(tenant)
    (run,) = {d.scheduled_run_id for d in WebhookDelivery.objects.filter(endpoint=endpoint)}
    relay = BackgroundRelay().start()
    ready_file = tmp_path / "worker.ready"
    # Its lease (the visibility timeout) ends 5 s after its last beat.
    process = worker_process(broker_names, ready_file, visibility=5)
    second: WorkerThread | None = None
    try:
        wait_until(ready_file.exists, timeout=30, message="the worker to be ready")
        wait_until(lambda: len(receiver.requests()) >= 2, timeout=30, message="two attempts")
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        second = WorkerThread(concurrency=2).start()

        # A new event does not join the dead run: it goes out within seconds.
        complete_a_job(tenant)
        newest = WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id").last()
        assert newest.scheduled_run_id != run
        wait_until(
            lambda: WebhookDelivery.objects.get(pk=newest.pk).status == "delivered",
            timeout=NEXT_DELIVERY_BOUND,
            message="the new delivery",
        )
        # The run comes back with its lease, and delivers its rest.
        wait_until(
            lambda: (
                set(
                    WebhookDelivery.objects.filter(endpoint=endpoint).values_list(
                        "status", flat=True
                    )
                )
                == {"delivered"}
            ),
            timeout=60,
            message="every delivery of the run",
        )
    finally:
        if process.poll() is None:
            process.kill()
        if second is not None:
            second.stop()
        relay.stop()
        connection.close()

    ids = Counter(request.headers["webhook-id"] for request in receiver.requests())
    deliveries = list(WebhookDelivery.objects.filter(endpoint=endpoint).order_by("id"))
    # The one the worker died at is sent again, with the same webhook-id; the others once.
    assert ids[deliveries[1].message_id] == 2
    assert all(ids[d.message_id] == 1 for d in deliveries if d.pk != deliveries[1].pk)
