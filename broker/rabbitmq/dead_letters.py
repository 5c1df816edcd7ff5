"""RabbitMQ's dead-letter queues as an operator sees them: look, count, send back."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from broker import topology
from broker.consume import (
    DeadLetter,
    DeadLetterBox,
)
from broker.rabbitmq.connection import blocking_connection, every_node_parameters
from broker.rabbitmq.publisher import republished_properties


def _error_headers(headers: dict[str, Any]) -> dict[str, str]:
    return {
        name: value.decode() if isinstance(value, bytes) else str(value)
        for name, value in headers.items()
        if name.startswith("x-error-")
    }


class RabbitMQDeadLetterBox(DeadLetterBox):
    """``basic_get`` without ack: what is not sent back returns to the dead-letter queue
    when the channel closes."""

    def __init__(self, url: str | None = None) -> None:
        self._connection = blocking_connection(every_node_parameters(url))

    def _take(self, channel, destination: str, limit: int):
        taken = []
        queue = topology.dead_letter_queue_name(destination)
        while len(taken) < limit:
            method, properties, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                break
            headers = properties.headers or {}
            letter = DeadLetter(destination, body, _error_headers(headers), properties.message_id)
            taken.append((method, properties, letter))
        return taken

    def peek(self, destination: str, limit: int) -> list[DeadLetter]:
        channel = self._connection.channel()
        try:
            return [letter for _, _, letter in self._take(channel, destination, limit)]
        finally:
            channel.close()

    def count(self, destination: str) -> int:
        channel = self._connection.channel()
        try:
            declared = channel.queue_declare(
                topology.dead_letter_queue_name(destination), passive=True
            )
            return declared.method.message_count
        finally:
            if channel.is_open:
                channel.close()

    def requeue(
        self,
        destination: str,
        choose: Callable[[DeadLetter], bool],
        limit: int,
        before_send: Callable[[DeadLetter], None] | None = None,
    ) -> list[DeadLetter]:
        channel = self._connection.channel()
        publisher = self._connection.channel()
        publisher.confirm_delivery()
        sent = []
        try:
            for method, properties, letter in self._take(channel, destination, limit):
                if not choose(letter):
                    continue
                headers = {
                    name: value
                    for name, value in (properties.headers or {}).items()
                    if not name.startswith("x-error-") and name not in _BROKER_HEADERS
                }
                if before_send is not None:
                    before_send(letter)
                publisher.basic_publish(
                    "",
                    topology.queue_name(destination),
                    letter.body,
                    republished_properties(properties, headers),
                    mandatory=True,
                )
                channel.basic_ack(method.delivery_tag)
                sent.append(letter)
        finally:
            channel.close()
            publisher.close()
        return sent

    def discard(
        self, destination: str, choose: Callable[[DeadLetter], bool], limit: int
    ) -> list[DeadLetter]:
        channel = self._connection.channel()
        discarded = []
        try:
            for method, _, letter in self._take(channel, destination, limit):
                if choose(letter):
                    channel.basic_ack(method.delivery_tag)
                    discarded.append(letter)
        finally:
            # What was not chosen goes back to the dead-letter queue with the channel.
            channel.close()
        return discarded

    def close(self) -> None:
        if self._connection.is_open:
            self._connection.close()


# Set by the broker on a dead-lettered or redelivered message; a fresh copy starts clean.
_BROKER_HEADERS = {
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
    "x-delivery-count",
    "x-original-queue",
}
