"""Consuming from RabbitMQ with pika's ``BlockingConnection``, owned by one I/O thread.

pika is not thread-safe, so one thread (the worker's main loop) owns the connection and
calls ``poll`` many times a second: that is what sends and answers the connection's
heartbeats, even while every task of the process runs for an hour in other threads.
A worker thread that settles a message asks the I/O thread to do it
(``add_callback_threadsafe``) and waits for the answer; ``ack_many`` settles a whole
group in one such call, with one ``basic.ack`` (``multiple``) for the longest run of
delivery tags it can cover.

A message being worked on simply stays unacked: the broker keeps it from everyone else
and gives it back if the connection dies (which is what a killed worker looks like).
The window (``prefetch``) is the process's, whatever the number of queues it consumes:
quorum queues take no channel-wide (``global``) prefetch, so each consumer gets its share
of it (``prefetch_shares``: ``basic_qos`` before each ``basic_consume``), the first queues
of the list one more when it does not divide evenly. A worker consuming four queues with a
window of 64 holds at most 16 unacked messages of each. A share is at most 65,535, the
largest count the protocol's ``basic.qos`` carries.

Dead-lettering publishes a copy, through the default exchange, to the queue's ``-dlq``
with the error in ``x-error-*`` headers, on a channel with publisher confirms; the caller
acks the original once the broker confirmed the copy and the failure is recorded.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from functools import partial
from typing import Any, TypeVar

import pika
import pika.exceptions
from django.conf import settings

from broker import topology
from broker.base import TransportUnavailable
from broker.consume import (
    Consumer,
    Delivery,
    FailureContext,
)
from broker.rabbitmq.connection import blocking_connection, every_node_parameters
from broker.rabbitmq.publisher import republished_properties
from broker.rabbitmq.topology import declarations, exchange_declaration

logger = logging.getLogger("hubdommed.worker")

T = TypeVar("T")

# Seconds a worker thread waits for the I/O thread to settle a message.
SETTLE_TIMEOUT = 30.0

# The largest ``prefetch_count`` of ``basic.qos`` (a 16-bit field; 0 means no limit).
MAX_PREFETCH_COUNT = 65_535


def prefetch_shares(prefetch: int, consumers: int) -> list[int]:
    """The window split across the consumers, in their order: together ``prefetch``
    (each at least one: a prefetch of 0 would be no limit at all; and at most what
    ``basic.qos`` can carry, so a window beyond it is held at that)."""
    if consumers < 1:
        return []
    base, extra = divmod(prefetch, consumers)
    return [
        min(MAX_PREFETCH_COUNT, max(1, base + (1 if index < extra else 0)))
        for index in range(consumers)
    ]


class RabbitMQConsumer(Consumer):
    name = "rabbitmq"
    can_delay = False
    # The broker requeues a closed connection's unacked messages at once.
    returns_unsettled_at_once = True

    def __init__(self, url: str | None = None) -> None:
        self._url = url
        self._connection: pika.BlockingConnection | None = None
        self._channel: Any = None
        self._publisher: Any = None
        self._io_thread: int | None = None
        self._received: list[Delivery] = []
        self._consumer_tags: list[str] = []
        self._generation = 0
        # Delivery tags of the current channel not settled yet (touched on the I/O thread
        # only): what tells whether one ``multiple`` ack may cover a group.
        self._unacked: set[int] = set()

    # -- connection ------------------------------------------------------------------------

    def start(self, destinations: Sequence[str], prefetch: int) -> None:
        # Every node of the list, the current one first: pika tries each in turn.
        nodes = every_node_parameters(self._url)
        for params in nodes:
            if settings.WORKER_RABBITMQ_HEARTBEAT:
                params.heartbeat = settings.WORKER_RABBITMQ_HEARTBEAT
        try:
            self._connection = blocking_connection(nodes)
            self._io_thread = threading.get_ident()
            self._generation += 1
            self._unacked = set()
            channel = self._connection.channel()
            method, kwargs = exchange_declaration()
            getattr(channel, method)(**kwargs)
            for destination in destinations:
                for method, kwargs in declarations(destination):
                    getattr(channel, method)(**kwargs)
            self._consumer_tags = []
            for destination, share in zip(
                destinations, prefetch_shares(prefetch, len(destinations)), strict=True
            ):
                # Applies to the consumers started after it on this channel.
                channel.basic_qos(prefetch_count=share)
                self._consumer_tags.append(
                    channel.basic_consume(
                        topology.queue_name(destination),
                        on_message_callback=partial(self._on_message, destination),
                    )
                )
            self._channel = channel
            self._publisher = self._connection.channel()
            self._publisher.confirm_delivery()
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise TransportUnavailable(f"cannot consume from RabbitMQ: {exc!r}") from exc

    def _on_message(self, destination: str, _channel, method, properties, body: bytes) -> None:
        headers = properties.headers or {}
        # Quorum queues count earlier deliveries of this very message.
        earlier = headers.get("x-delivery-count") or 0
        self._unacked.add(method.delivery_tag)
        self._received.append(
            Delivery(
                destination=destination,
                body=body,
                receipt=method.delivery_tag,
                broker_receive_count=int(earlier) + 1,
                message_id=properties.message_id,
                properties=properties,
                generation=self._generation,
            )
        )

    def poll(self, timeout: float) -> list[Delivery]:
        if self._connection is None:
            raise TransportUnavailable("not connected to RabbitMQ")
        if not self._connection.is_open:
            # Lost while a settlement wrote to it (its error was that settlement's): pika
            # would only raise about its closed timers now.
            self.close()
            raise TransportUnavailable("RabbitMQ connection lost")
        try:
            # Returns early when something arrives (a delivery, a settlement to run).
            self._connection.process_data_events(time_limit=timeout)
        except pika.exceptions.AMQPError as exc:
            self.close()
            raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc
        received, self._received = self._received, []
        return received

    def stop_fetching(self) -> None:
        channel, tags, self._consumer_tags = self._channel, self._consumer_tags, []
        if channel is None or not channel.is_open:
            return
        try:
            for tag in tags:
                # Messages the broker sent but our callback has not seen yet go back.
                channel.basic_cancel(tag)
        except pika.exceptions.AMQPError as exc:
            logger.warning("could not cancel the RabbitMQ consumers: %r", exc)

    def close(self) -> None:
        connection, self._connection = self._connection, None
        self._channel = self._publisher = None
        if connection is not None and connection.is_open:
            try:
                connection.close()
            except Exception:  # closing a broken connection: the broker requeues anyway
                logger.debug("error closing the RabbitMQ connection", exc_info=True)

    # -- settling (any thread) -------------------------------------------------------------

    def _on_io_thread(self, fn: Callable[[], T], *, wait: bool = True) -> T | None:
        connection = self._connection
        if connection is None:
            raise TransportUnavailable("not connected to RabbitMQ")
        if threading.get_ident() == self._io_thread:
            return fn()
        if not wait:
            try:
                connection.add_callback_threadsafe(fn)
            except pika.exceptions.AMQPError as exc:
                raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc
            return None
        answer: Future = Future()

        def run() -> None:
            try:
                answer.set_result(fn())
            except BaseException as exc:
                answer.set_exception(exc)

        try:
            connection.add_callback_threadsafe(run)
        except pika.exceptions.AMQPError as exc:
            raise TransportUnavailable(f"RabbitMQ connection lost: {exc!r}") from exc
        try:
            return answer.result(timeout=SETTLE_TIMEOUT)
        except FutureTimeout:
            # The connection this was queued on was replaced before running it: the broker
            # took the message back with that connection.
            raise TransportUnavailable("no answer from the RabbitMQ connection") from None

    def _settle(self, delivery: Delivery, action: Callable[[Any], None]) -> None:
        def run() -> None:
            channel = self._channel
            if delivery.generation != self._generation or channel is None or not channel.is_open:
                # The connection it came on is gone, and the broker took it back with it.
                raise TransportUnavailable("the message's connection is gone; it was requeued")
            try:
                action(channel)
            except pika.exceptions.AMQPError as exc:
                raise TransportUnavailable(f"RabbitMQ refused to settle: {exc!r}") from exc
            self._unacked.discard(delivery.receipt)

        self._on_io_thread(run)

    def ack(self, delivery: Delivery) -> None:
        self._settle(delivery, lambda channel: channel.basic_ack(delivery.receipt))

    def ack_many(self, deliveries: Sequence[Delivery], *, wait: bool = True) -> list[Delivery]:
        if not deliveries:
            return []

        def run() -> list[Delivery]:
            channel = self._channel
            if channel is None or not channel.is_open:
                return list(deliveries)
            current = [d for d in deliveries if d.generation == self._generation]
            gone = [d for d in deliveries if d.generation != self._generation]
            tags = sorted(d.receipt for d in current)
            # The lowest unsettled tags of the channel that are all in this group: one
            # ``multiple`` ack covers them; the others are acked one by one (in the same
            # write to the socket).
            covered = 0
            for ours, outstanding in zip(tags, sorted(self._unacked), strict=False):
                if ours != outstanding:
                    break
                covered += 1
            try:
                if covered > 1:
                    channel.basic_ack(tags[covered - 1], multiple=True)
                else:
                    covered = 0
                for tag in tags[covered:]:
                    channel.basic_ack(tag)
            except pika.exceptions.AMQPError as exc:
                # The channel broke: the broker takes back what was not acked.
                logger.warning("acking %d messages failed: %r", len(tags), exc)
                return list(deliveries)
            self._unacked.difference_update(tags)
            return gone

        try:
            return self._on_io_thread(run, wait=wait) or []
        except TransportUnavailable:
            return list(deliveries)

    def release(self, delivery: Delivery) -> None:
        self._settle(delivery, lambda channel: channel.basic_nack(delivery.receipt, requeue=True))

    def retry_later(self, delivery: Delivery, delay: float) -> None:
        # No broker-side delay here by design: the message comes back at once. The task
        # runtime re-arms the outbox row instead (available_at) and acks.
        self.release(delivery)

    def dead_letter(self, delivery: Delivery, failure: FailureContext) -> None:
        original = delivery.properties or pika.BasicProperties()
        headers = dict(original.headers or {})
        headers.update(failure.as_dict())
        headers["x-original-queue"] = topology.queue_name(delivery.destination)
        properties = republished_properties(original, headers)

        def park() -> None:
            publisher = self._publisher
            if publisher is None or not publisher.is_open:
                raise TransportUnavailable("the RabbitMQ publishing channel is closed")
            try:
                # Returns once the broker confirmed it (the channel is in confirm mode).
                publisher.basic_publish(
                    "",
                    topology.dead_letter_queue_name(delivery.destination),
                    delivery.body,
                    properties,
                    mandatory=True,
                )
            except pika.exceptions.AMQPError as exc:
                raise TransportUnavailable(f"dead-lettering failed: {exc!r}") from exc

        self._on_io_thread(park)

    def extend(self, delivery: Delivery) -> None:
        """Nothing to do: an unacked message stays ours while the connection lives."""

    def heartbeat_interval(self, delivery: Delivery) -> float | None:
        return None
