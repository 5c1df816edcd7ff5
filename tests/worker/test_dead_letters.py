"""manage.py dead_letters: list what is parked, send chosen messages back with their runs."""

from __future__ import annotations

import json
import uuid
from io import StringIO

import pika
import pytest
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import transaction

from broker import ensure_automation_queue, topology
from broker.sqs.publisher import sqs_client
from outbox.models import OutboxMessage, TaskRun
from outbox.services import publish
from tests.broker_queues import delete_queues
from tests.worker.conftest import dead_letters, dispatch_work, run_finished, run_of, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _park_two(start_worker) -> tuple[str, str]:
    worker = start_worker()
    first, second = dispatch_work(permanent=True), dispatch_work(permanent=True)
    wait_for(lambda: run_finished(first) and run_finished(second), what="both runs to fail")
    wait_for(lambda: len(dead_letters("default")) == 2, what="both dead letters")
    worker.stop()
    return first, second


def test_dead_letters_lists_each_parked_message_with_its_error(broker, relay, start_worker):
    first, second = _park_two(start_worker)
    out = StringIO()

    call_command("dead_letters", "--queue", "default", stdout=out)

    text = out.getvalue()
    assert "-dlq: 2" in text
    assert first in text and second in text
    assert "common.errors.InvalidInput: the payload can never be processed" in text
    # Looking leaves them where they are.
    assert len(dead_letters("default")) == 2


def test_dead_letters_counts_what_waits_not_what_it_listed(broker, relay, start_worker):
    first, second = _park_two(start_worker)
    out = StringIO()

    call_command("dead_letters", "--queue", "default", "--limit", "1", stdout=out)

    lines = out.getvalue().splitlines()
    assert lines[0].endswith("-dlq: 2 waiting (the first 1 listed)"), lines
    assert len(lines) == 2 and (first in lines[1] or second in lines[1])
    assert len(dead_letters("default")) == 2


def test_dead_letters_sends_a_chosen_message_back_with_its_run_queued(broker, relay, start_worker):
    first, second = _park_two(start_worker)

    call_command("dead_letters", "--queue", "default", "--requeue", first, stdout=StringIO())

    run = run_of(first)
    assert run.status == TaskRun.Status.QUEUED
    assert run.receive_count == 0
    assert run_of(second).status == TaskRun.Status.FAILED
    assert [letter.run_id for letter in dead_letters("default")] == [second]
    # Back in its queue: a worker receives it again (and parks it again, as it is bad input).
    start_worker()
    wait_for(lambda: run_finished(first), what="the requeued run to be received again")
    assert run_of(first).receive_count == 1


def test_dead_letters_requeue_all_empties_the_dead_letter_queue(broker, relay, start_worker):
    first, second = _park_two(start_worker)

    call_command("dead_letters", "--queue", "default", "--requeue-all", stdout=StringIO())

    assert dead_letters("default") == []
    assert {run_of(first).status, run_of(second).status} == {TaskRun.Status.QUEUED}


def test_dead_letters_refuses_an_unknown_queue(broker):
    with pytest.raises(CommandError, match="unknown destination"):
        call_command("dead_letters", "--queue", "nowhere")


def test_a_dead_letter_of_an_automation_queue_goes_back_without_a_task_run(broker, tenant):
    """Messages to an automation's worker have no task run: listing and sending them back
    works all the same, and writes none."""
    automation_id = 900_000 + uuid.uuid4().int % 1000
    ensure_automation_queue(automation_id)
    destination = f"automation-{automation_id}"
    with transaction.atomic():
        published = publish(
            "JobCreated",
            {"automation_id": automation_id, "job_id": 1},
            tenant=tenant,
            aggregate=("Job", 1),
        )
    (row,) = [
        row for row in OutboxMessage.objects.all() if row.envelope["destination"] == destination
    ]
    # The broker's redrive parks it (as after too many receives): put it in the DLQ.
    _send_to_dead_letter_queue(broker, destination, json.dumps(row.envelope))
    try:
        out = StringIO()
        call_command("dead_letters", "--queue", destination, stdout=out)
        assert "-dlq: 1 waiting" in out.getvalue()

        call_command("dead_letters", "--queue", destination, "--requeue-all", stdout=out)

        assert dead_letters(destination) == []
        assert str(row.run_id) in out.getvalue()
        assert not TaskRun.objects.filter(run_id__in=published.run_ids, task="worker.job_available")
    finally:
        _delete_automation_queues(broker, destination)


def _send_to_dead_letter_queue(broker: str, destination: str, body: str) -> None:
    if broker == "rabbitmq":
        connection = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            connection.channel().basic_publish(
                "", topology.dead_letter_queue_name(destination), body.encode()
            )
        finally:
            connection.close()
    else:
        client = sqs_client()
        url = client.get_queue_url(QueueName=topology.dead_letter_queue_name(destination))
        client.send_message(QueueUrl=url["QueueUrl"], MessageBody=body)


def _delete_automation_queues(broker: str, destination: str) -> None:
    if broker == "rabbitmq":
        delete_queues(settings.RABBITMQ_URL, [destination])
