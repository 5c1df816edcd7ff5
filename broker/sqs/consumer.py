"""Consuming from Amazon SQS: long polls per queue, visibility as heartbeat and delay.

One poller thread per queue long-polls (``WaitTimeSeconds``) for as many messages as
the process has free slots (``prefetch``, at most 10 a call), so an idle worker costs a
request every few seconds per queue, not a busy loop. A slot is taken when a message is
received and given back when it is settled.

Received messages are invisible for the queue's visibility timeout (the design's table,
or ``WORKER_VISIBILITY_TIMEOUT``); the worker's heartbeat extends it every third of that
while the task runs. A transient failure sets the visibility to the backoff and leaves
the message in the queue, so it comes back by itself without holding a slot; a release
sets it to 0. Dead-lettering sends a copy to the ``-dlq`` queue with the error in
``x-error-*`` message attributes; the caller then deletes the original (``ack``).
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from collections.abc import Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from broker import topology
from broker.base import TransportUnavailable
from broker.consume import (
    Consumer,
    Delivery,
    FailureContext,
    heartbeat_interval,
    visibility_timeout,
)
from broker.sqs.publisher import MAX_BATCH_BYTES, SQSTransport, sqs_client

logger = logging.getLogger("hubdommed.worker")

MAX_RECEIVE = 10
# SQS keeps a message invisible for at most 12 hours.
MAX_VISIBILITY = 12 * 3600
# After a failed receive, the poller waits this long before the next one.
POLL_ERROR_BACKOFF = 2.0


class SQSConsumer(Consumer):
    name = "sqs"
    can_delay = True

    def __init__(self) -> None:
        self._client: Any = None
        self._urls: dict[str, str] = {}
        self._dead_letter_urls: dict[str, str] = {}
        self._inbox: queue.Queue[Delivery] = queue.Queue()
        self._slots = threading.Semaphore(1)
        self._stop = threading.Event()
        self._pollers: list[threading.Thread] = []

    def start(self, destinations: Sequence[str], prefetch: int) -> None:
        self._client = sqs_client()
        transport = SQSTransport()
        try:
            for destination in destinations:
                self._urls[destination] = transport.queue_url(destination)
                self._dead_letter_urls[destination] = self._client.get_queue_url(
                    QueueName=topology.dead_letter_queue_name(destination)
                )["QueueUrl"]
        except (BotoCoreError, ClientError) as exc:
            raise TransportUnavailable(f"cannot consume from SQS: {exc}") from exc
        finally:
            transport.close()
        self._slots = threading.Semaphore(prefetch)
        self._stop.clear()
        self._pollers = [
            threading.Thread(
                target=self._poll_queue, args=(destination,), name=f"sqs-{destination}", daemon=True
            )
            for destination in destinations
        ]
        for poller in self._pollers:
            poller.start()

    def _poll_queue(self, destination: str) -> None:
        client = sqs_client()
        url = self._urls[destination]
        wait = min(20, settings.WORKER_SQS_WAIT_SECONDS)  # the most SQS allows
        try:
            while not self._stop.is_set():
                if not self._slots.acquire(timeout=0.2):
                    continue
                slots = 1
                while slots < MAX_RECEIVE and self._slots.acquire(blocking=False):
                    slots += 1
                try:
                    messages = client.receive_message(
                        QueueUrl=url,
                        MaxNumberOfMessages=slots,
                        WaitTimeSeconds=wait,
                        VisibilityTimeout=visibility_timeout(destination),
                        AttributeNames=["ApproximateReceiveCount"],
                        MessageAttributeNames=["All"],
                    ).get("Messages", [])
                except (BotoCoreError, ClientError) as exc:
                    logger.warning("SQS receive from %s failed: %s", destination, exc)
                    messages = []
                    self._stop.wait(POLL_ERROR_BACKOFF)
                for _ in range(slots - len(messages)):
                    self._slots.release()
                for message in messages:
                    self._inbox.put(
                        Delivery(
                            destination=destination,
                            body=message["Body"].encode(),
                            receipt=message["ReceiptHandle"],
                            broker_receive_count=int(
                                message.get("Attributes", {}).get("ApproximateReceiveCount", 1)
                            ),
                            message_id=message.get("MessageId"),
                            properties=message.get("MessageAttributes", {}),
                        )
                    )
        finally:
            client.close()

    def poll(self, timeout: float) -> list[Delivery]:
        try:
            received = [self._inbox.get(timeout=timeout)]
        except queue.Empty:
            return []
        while True:
            try:
                received.append(self._inbox.get_nowait())
            except queue.Empty:
                return received

    def stop_fetching(self) -> None:
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        for poller in self._pollers:
            # A long poll in progress ends within WaitTimeSeconds; we need not wait for it.
            poller.join(timeout=0.1)
        if self._client is not None:
            self._client.close()
            self._client = None

    # -- settling (any thread; boto3 clients are thread-safe) ------------------------------

    def _call(self, operation: str, **kwargs) -> Any:
        client = self._client
        if client is None:
            raise TransportUnavailable("the SQS consumer is closed")
        try:
            return getattr(client, operation)(**kwargs)
        except (BotoCoreError, ClientError) as exc:
            raise TransportUnavailable(f"SQS {operation} failed: {exc}") from exc

    def _settled(self, delivery: Delivery) -> None:
        self._slots.release()

    def _set_visibility(self, delivery: Delivery, seconds: float) -> None:
        self._call(
            "change_message_visibility",
            QueueUrl=self._urls[delivery.destination],
            ReceiptHandle=delivery.receipt,
            VisibilityTimeout=min(MAX_VISIBILITY, max(0, math.ceil(seconds))),
        )

    def ack(self, delivery: Delivery) -> None:
        try:
            self._call(
                "delete_message",
                QueueUrl=self._urls[delivery.destination],
                ReceiptHandle=delivery.receipt,
            )
        finally:
            self._settled(delivery)

    def ack_many(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[Delivery]:
        """``DeleteMessageBatch``: ten a call, per queue."""
        failed: list[Delivery] = []
        by_queue: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            by_queue.setdefault(delivery.destination, []).append(delivery)
        for destination, group in by_queue.items():
            for start in range(0, len(group), MAX_RECEIVE):
                chunk = group[start : start + MAX_RECEIVE]
                try:
                    answer = self._call(
                        "delete_message_batch",
                        QueueUrl=self._urls[destination],
                        Entries=[
                            {"Id": str(number), "ReceiptHandle": delivery.receipt}
                            for number, delivery in enumerate(chunk)
                        ],
                    )
                except TransportUnavailable:
                    failed.extend(chunk)
                else:
                    failed.extend(chunk[int(entry["Id"])] for entry in answer.get("Failed", []))
                finally:
                    for delivery in chunk:
                        self._settled(delivery)
        return failed

    def release(self, delivery: Delivery) -> None:
        try:
            self._set_visibility(delivery, 0)
        finally:
            self._settled(delivery)

    def retry_later(self, delivery: Delivery, delay: float) -> None:
        # Whole seconds only: SQS rounds nothing, so round the delay up.
        try:
            self._set_visibility(delivery, max(1.0, delay))
        finally:
            self._settled(delivery)

    def dead_letter(self, delivery: Delivery, failure: FailureContext) -> None:
        attributes = {
            name: value
            for name, value in (delivery.properties or {}).items()
            if not name.startswith("x-error-")
        }
        for name, value in failure.as_dict().items():
            attributes[name] = {"DataType": "String", "StringValue": value or "-"}
        attributes["x-original-queue"] = {
            "DataType": "String",
            "StringValue": topology.queue_name(delivery.destination),
        }
        # SQS allows 10 attributes and 256 KiB with the body: the error goes first.
        attributes = dict(list(attributes.items())[-10:])
        body = delivery.body.decode()
        if len(delivery.body) + _attributes_size(attributes) > MAX_BATCH_BYTES:
            attributes["x-error-traceback"]["StringValue"] = "-"
        self._call(
            "send_message",
            QueueUrl=self._dead_letter_urls[delivery.destination],
            MessageBody=body,
            MessageAttributes=attributes,
        )

    def extend(self, delivery: Delivery) -> None:
        self._set_visibility(delivery, visibility_timeout(delivery.destination))

    def heartbeat_interval(self, delivery: Delivery) -> float | None:
        return heartbeat_interval(delivery.destination)


def _attributes_size(attributes: dict[str, dict[str, str]]) -> int:
    return sum(
        len(name.encode()) + len(value["DataType"].encode()) + len(value["StringValue"].encode())
        for name, value in attributes.items()
    )
