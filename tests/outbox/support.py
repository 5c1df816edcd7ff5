"""What the stranded-row tests do to the broker and to time, on either broker.

A message is lost or dead-lettered the way a broker does it (a queue purged, deliveries
given back until the broker's own delivery limit moves the message to the dead-letter
queue); time is moved by shifting a run's and its row's timestamps back, as if all of it
had happened that long ago (no test waits an hour).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pika
from django.conf import settings
from django.db import connection

from broker import topology
from broker.sqs.publisher import sqs_client
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun


def lose_messages(destination: str = "default") -> None:
    """The broker loses every message its queue holds (purged, a node lost)."""
    _on_queue(destination, rabbitmq="queue_purge", sqs="purge_queue")


def delete_queue(destination: str = "default") -> None:
    """The queue is gone from the broker (deleted by hand, a new cluster without it)."""
    _on_queue(destination, rabbitmq="queue_delete", sqs="delete_queue")


def _on_queue(destination: str, *, rabbitmq: str, sqs: str) -> None:
    """Call a channel method (RabbitMQ) or a client method (SQS) on the queue."""
    name = topology.queue_name(destination)
    if settings.BROKER == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            getattr(conn.channel(), rabbitmq)(name)
        finally:
            conn.close()
    else:
        client = sqs_client()
        getattr(client, sqs)(QueueUrl=client.get_queue_url(QueueName=name)["QueueUrl"])


def deliver_until_dead_lettered(
    on_each: Callable[[dict], None], destination: str = "default", bound: int = 20
) -> int:
    """Take the queue's one message again and again and never settle it, as workers that
    die on it do, until the broker's own redrive moves it to the dead-letter queue
    (``x-delivery-limit``, ``maxReceiveCount``); ``on_each(envelope)`` runs for each
    delivery. Returns the deliveries."""
    deliveries = 0
    if settings.BROKER == "rabbitmq":
        conn = pika.BlockingConnection(pika.URLParameters(settings.RABBITMQ_URL))
        try:
            channel = conn.channel()
            while deliveries < bound:
                method, _, body = channel.basic_get(topology.queue_name(destination))
                if method is None:
                    return deliveries
                deliveries += 1
                on_each(json.loads(body))
                channel.basic_nack(method.delivery_tag, requeue=True)
        finally:
            conn.close()
    else:
        client = sqs_client()
        url = client.get_queue_url(QueueName=topology.queue_name(destination))["QueueUrl"]
        while deliveries < bound:
            answer = client.receive_message(QueueUrl=url, VisibilityTimeout=0, WaitTimeSeconds=1)
            messages = answer.get("Messages", [])
            if not messages:
                return deliveries
            deliveries += 1
            on_each(json.loads(messages[0]["Body"]))
    raise AssertionError(f"the broker never dead-lettered the message in {bound} deliveries")


def happened_ago(run_id: str, seconds: float) -> None:
    """Everything that happened to the run and its outbox row happened ``seconds`` earlier."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE task_runs
               SET updated_at = updated_at - %s * interval '1 second',
                   lease_expires_at = lease_expires_at - %s * interval '1 second',
                   rearmed_at = rearmed_at - %s * interval '1 second'
             WHERE run_id = %s
            """,
            [seconds, seconds, seconds, str(run_id)],
        )
        for table in ("outbox_messages", "platform_outbox_messages"):
            cursor.execute(
                f"UPDATE {table} SET sent_at = sent_at - %s * interval '1 second', "  # noqa: S608 (two known tables)
                "available_at = available_at - %s * interval '1 second' WHERE run_id = %s",
                [seconds, seconds, str(run_id)],
            )


def counts() -> tuple[int, int, int, int]:
    """Rows of the outbox's tables: messages, platform messages, task runs, events."""
    return (
        OutboxMessage.objects.count(),
        PlatformOutboxMessage.objects.count(),
        TaskRun.objects.count(),
        Event.objects.count(),
    )
