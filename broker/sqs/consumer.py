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

A stopping worker keeps no message from the others: what a long poll in progress
receives after the stop, and what was received and never taken by the loop, is made
visible again at once (not after its visibility timeout, minutes on some queues).
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
from broker.sqs.publisher import MAX_BATCH_BYTES, TIMEOUT, SQSTransport, sqs_client, sqs_text

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
        # Held to put into the inbox and to stop: nothing is put in once stopping.
        self._inbox_lock = threading.Lock()
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
        wait = min(20, settings.WORKER_SQS_WAIT_SECONDS)  # the most SQS allows
        # A receive waits for its long poll, then for the answer like any request: given up
        # on sooner, it would be sent again while SQS still held the first open, and what
        # that first one took would stay hidden for its visibility.
        client = sqs_client(read_timeout=wait + TIMEOUT)
        url = self._urls[destination]
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
                deliveries = [_delivery(destination, message) for message in messages]
                with self._inbox_lock:
                    stopping = self._stop.is_set()
                    if not stopping:
                        for delivery in deliveries:
                            self._inbox.put(delivery)
                if stopping and deliveries:
                    # Received by a poll that began before the stop: not this worker's.
                    self._make_visible(client, deliveries)
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
        with self._inbox_lock:
            self._stop.set()

    def close(self) -> None:
        with self._inbox_lock:
            self._stop.set()
            unpolled: list[Delivery] = []
            while not self._inbox.empty():
                unpolled.append(self._inbox.get_nowait())
        if unpolled and self._client is not None:
            self._make_visible(self._client, unpolled)
        for poller in self._pollers:
            # A long poll in progress ends within WaitTimeSeconds; we need not wait for it
            # (what it receives, its poller makes visible again itself).
            poller.join(timeout=0.1)
        if self._client is not None:
            self._client.close()
            self._client = None

    def _make_visible(self, client: Any, deliveries: list[Delivery]) -> None:
        """Give these back to the queue now (visibility 0), ten to a call; one that fails
        comes back when its visibility ends."""
        for _ in deliveries:
            self._slots.release()
        by_queue: dict[str, list[Delivery]] = {}
        for delivery in deliveries:
            by_queue.setdefault(delivery.destination, []).append(delivery)
        kept = 0
        for destination, given in by_queue.items():
            for start in range(0, len(given), MAX_RECEIVE):
                entries = [
                    {"Id": str(n), "ReceiptHandle": d.receipt, "VisibilityTimeout": 0}
                    for n, d in enumerate(given[start : start + MAX_RECEIVE])
                ]
                try:
                    failed = client.change_message_visibility_batch(
                        QueueUrl=self._urls[destination], Entries=entries
                    ).get("Failed", [])
                except (BotoCoreError, ClientError) as exc:
                    failed, reason = entries, exc
                else:
                    reason = failed
                if failed:
                    kept += len(failed)
                    logger.warning(
                        "could not give back %d %s: %s",
                        len(failed),
                        "message" if len(failed) == 1 else "messages",
                        reason,
                    )
        logger.info(
            "gave back %d of %d messages received while stopping",
            len(deliveries) - kept,
            len(deliveries),
        )

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
        # The error may quote anything: what SQS refuses in an attribute is replaced, or
        # the copy is refused every time and the run never settles.
        for name, value in failure.as_dict().items():
            attributes[name] = {"DataType": "String", "StringValue": sqs_text(value) or "-"}
        attributes["x-original-queue"] = {
            "DataType": "String",
            "StringValue": topology.queue_name(delivery.destination),
        }
        # SQS allows 10 attributes and 256 KiB with the body: the error goes first; the
        # traceback, then the message, are cut to leave room for the body.
        attributes = dict(list(attributes.items())[-10:])
        body = delivery.body.decode()
        for name in ("x-error-traceback", "x-error-message"):
            over = len(delivery.body) + _attributes_size(attributes) - MAX_BATCH_BYTES
            if over <= 0:
                break
            value = attributes[name]["StringValue"].encode()
            kept = value[: max(0, len(value) - over - 1)].decode(errors="ignore")
            attributes[name]["StringValue"] = kept or "-"
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


def _attributes_size(attributes: dict[str, dict[str, Any]]) -> int:
    return sum(
        len(name.encode())
        + len(value["DataType"].encode())
        + len(value.get("StringValue", "").encode())
        + len(value.get("BinaryValue", b""))
        for name, value in attributes.items()
    )


def _delivery(destination: str, message: dict[str, Any]) -> Delivery:
    return Delivery(
        destination=destination,
        body=message["Body"].encode(),
        receipt=message["ReceiptHandle"],
        broker_receive_count=int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
        message_id=message.get("MessageId"),
        properties=message.get("MessageAttributes", {}),
    )
