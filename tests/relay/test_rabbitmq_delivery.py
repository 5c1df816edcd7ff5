"""The relay over the real RabbitMQ: what is committed arrives, once, where it belongs."""

from __future__ import annotations

import threading
import time
from io import StringIO

import pika
import pytest
from django.db import connection, transaction
from django.db.models import F

from broker import ensure_automation_queue, topology
from outbox.models import OutboxMessage, PlatformOutboxMessage
from outbox.services import dispatch, publish
from relay.management.commands.run_relay import Command
from tests.factories import TenantFactory
from tests.ports import free_port
from tests.relay.conftest import drain, insert_pending_rows, run_ids

pytestmark = pytest.mark.django_db(transaction=True)


def relay_command() -> Command:
    return Command(stdout=StringIO(), stderr=StringIO())


def commit_mixed_work(tenant, jobs: int) -> None:
    """Tenant events with two subscribers each, plus platform dispatches."""
    for job_id in range(jobs):
        with transaction.atomic():
            publish(
                "JobCreated",
                {"automation_id": 5 if job_id % 2 else 6, "job_id": job_id},
                tenant=tenant,
                aggregate=("Job", job_id),
            )
            dispatch("maintenance.purge", {"n": job_id})


def test_every_committed_row_arrives_exactly_once_in_a_fault_free_run(rabbit):
    tenant = TenantFactory()
    commit_mixed_work(tenant, jobs=60)

    drain(relay_command())

    received = {d: [env for _, env in rabbit.take_all(d)] for d in topology_destinations()}
    counted = run_ids(env for envelopes in received.values() for env in envelopes)
    expected = {str(r) for r in OutboxMessage.objects.values_list("run_id", flat=True)} | {
        str(r) for r in PlatformOutboxMessage.objects.values_list("run_id", flat=True)
    }
    assert len(expected) == 180
    assert set(counted) == expected
    assert set(counted.values()) == {1}, "a run_id arrived twice"
    assert not OutboxMessage.objects.filter(sent_at__isnull=True).exists()
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()


def topology_destinations():
    return ("critical", "default", "bulk", "maintenance", "automation-5", "automation-6")


def test_each_queue_receives_exactly_the_messages_addressed_to_it(rabbit):
    tenant = TenantFactory()
    commit_mixed_work(tenant, jobs=4)

    drain(relay_command())

    def tasks(destination):
        return sorted(
            (env["task"], env["payload"].get("automation_id"))
            for _, env in rabbit.take_all(destination)
        )

    assert tasks("automation-5") == [("worker.job_available", 5)] * 2
    assert tasks("automation-6") == [("worker.job_available", 6)] * 2
    assert tasks("critical") == [("machines.power_on", 5)] * 2 + [("machines.power_on", 6)] * 2
    assert tasks("maintenance") == [("maintenance.purge", None)] * 4
    assert tasks("default") == [] and tasks("bulk") == []


def test_messages_are_persistent_with_run_id_type_and_correlation_id(rabbit):
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {"older_than_days": 7})

    drain(relay_command())

    ((properties, envelope),) = rabbit.take_all("maintenance")
    assert properties.message_id == str(run_id) == envelope["run_id"]
    assert properties.delivery_mode == 2
    assert properties.content_type == "application/json"
    assert properties.type == "maintenance.purge"
    assert properties.headers["type"] == "maintenance.purge"
    assert properties.headers["correlation_id"] == envelope["correlation_id"]
    assert envelope["payload"] == {"older_than_days": 7}


def test_a_row_due_in_the_future_is_not_sent_before_its_available_at(rabbit):
    with transaction.atomic():
        later = dispatch("maintenance.purge", {}, delay=3600)
        now = dispatch("maintenance.purge", {})

    drain(relay_command())

    assert [env["run_id"] for _, env in rabbit.take_all("maintenance")] == [str(now)]
    row = PlatformOutboxMessage.objects.get(run_id=later)
    assert row.sent_at is None and row.attempts == 0

    # Its time comes (moved by the database clock, the one the relay compares with).
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE platform_outbox_messages SET available_at = clock_timestamp() "
            "WHERE run_id = %s",
            [later],
        )
    drain(relay_command())

    assert [env["run_id"] for _, env in rabbit.take_all("maintenance")] == [str(later)]


def test_with_the_broker_unreachable_rows_stay_pending_and_all_arrive_once_it_is_back(
    settings, rabbit, caplog
):
    with transaction.atomic():
        sent_before = [dispatch("maintenance.purge", {"n": n}) for n in range(3)]
    good_url = settings.RABBITMQ_URL
    settings.RABBITMQ_URL = f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F"
    command = relay_command()

    assert command.relay_one_batch() is False
    assert command.relay_one_batch() is False

    rows = PlatformOutboxMessage.objects.filter(run_id__in=sent_before)
    assert [(r.sent_at, r.attempts) for r in rows] == [(None, 2)] * 3
    assert command.relay.outages == 2 and command.relay.outage_backoff > 0
    assert "broker unreachable" in caplog.text

    settings.RABBITMQ_URL = good_url
    drain(command)

    assert command.relay.outages == 0
    assert sorted(env["run_id"] for _, env in rabbit.take_all("maintenance")) == sorted(
        str(r) for r in sent_before
    )
    assert not rows.filter(sent_at__isnull=True).exists()


def test_a_row_the_broker_refuses_backs_off_without_holding_up_the_others(settings, rabbit):
    # Long enough that a loaded machine's pause between the two passes cannot make the
    # refused row due again (the default, 1 s, could).
    settings.RELAY_RETRY_BACKOFF = 60
    with transaction.atomic():
        poison = dispatch("maintenance.purge", {})
        fine = [dispatch("maintenance.purge", {"n": n}) for n in range(3)]
    # An envelope no queue can take (written by a bug, or by hand).
    PlatformOutboxMessage.objects.filter(run_id=poison).update(
        envelope={"run_id": str(poison), "task": "x", "destination": "nowhere"}
    )

    command = relay_command()
    assert command.relay_one_batch() is False
    assert command.relay_one_batch() is False  # not due again yet: no hot loop

    bad = PlatformOutboxMessage.objects.annotate(wait=F("available_at") - F("created_at")).get(
        run_id=poison
    )
    assert bad.sent_at is None and bad.attempts == 1
    assert bad.wait.total_seconds() >= 0.5
    assert sorted(env["run_id"] for _, env in rabbit.take_all("maintenance")) == sorted(
        str(r) for r in fine
    )


def test_a_full_batch_runs_the_next_pass_at_once(settings):
    settings.RELAY_BATCH_SIZE = 10
    insert_pending_rows(25)
    command = relay_command()

    assert [command.relay_one_batch() for _ in range(3)] == [True, True, False]
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()


def test_two_relays_over_10000_rows_send_none_twice(settings, rabbit):
    settings.RELAY_BATCH_SIZE = 200
    insert_pending_rows(10_000)
    start = threading.Barrier(2)
    commands = [relay_command(), relay_command()]
    errors = []

    def run(command):
        try:
            start.wait()
            drain(command)
        except Exception as exc:  # surfaced below
            errors.append(exc)
        finally:
            command.relay.close()
            connection.close()

    threads = [threading.Thread(target=run, args=(c,)) for c in commands]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    counted = run_ids(env for _, env in rabbit.take_all("default", idle=1.0))
    assert len(counted) == 10_000
    assert max(counted.values()) == 1, "a row was sent twice"
    assert [c.relay.sent > 0 for c in commands] == [True, True], "one relay did all the work"
    assert sum(c.relay.sent for c in commands) == 10_000
    assert not PlatformOutboxMessage.objects.filter(sent_at__isnull=True).exists()


def test_an_automation_queue_is_created_on_demand_with_its_dead_letter_queue(settings):
    name = ensure_automation_queue(77)
    assert name == f"{settings.QUEUE_PREFIX}automation-77"
    assert ensure_automation_queue(77) == name  # idempotent

    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        channel.queue_declare(name, passive=True)
        channel.queue_declare(name + "-dlq", passive=True)
    finally:
        conn.close()


def test_a_message_delivered_more_than_the_limit_goes_to_the_dead_letter_queue(settings):
    with transaction.atomic():
        run_id = dispatch("maintenance.purge", {})
    drain(relay_command())
    queue = topology.queue_name("maintenance")

    conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
    try:
        channel = conn.channel()
        deliveries = 0
        # A consumer that dies on it every time: the broker's redrive ends it after 7. A
        # quiet second is not the end on a loaded machine: wait for all of them, bounded.
        deadline = time.monotonic() + 30
        for method, _properties, _body in channel.consume(queue, inactivity_timeout=1.0):
            if method is None:
                if deliveries >= topology.MAX_RECEIVES or time.monotonic() > deadline:
                    break
                continue
            deliveries += 1
            channel.basic_nack(method.delivery_tag, requeue=True)
        channel.cancel()
        dead = channel.basic_get(queue + "-dlq", auto_ack=True)
    finally:
        conn.close()

    assert deliveries == topology.MAX_RECEIVES
    assert dead[1].message_id == str(run_id)
