"""SQS's dead-letter queues as an operator sees them: look, count, send back."""

from __future__ import annotations

from collections.abc import Callable

from broker import topology
from broker.consume import (
    DeadLetter,
    DeadLetterBox,
)
from broker.sqs.consumer import MAX_RECEIVE
from broker.sqs.publisher import sqs_client

# How long a peeked dead letter stays hidden before being made visible again.
PEEK_VISIBILITY = 30


class SQSDeadLetterBox(DeadLetterBox):
    """Receives from the ``-dlq`` queue (hiding what it looks at), then makes visible again
    what it does not send back."""

    def __init__(self) -> None:
        self._client = sqs_client()

    def _take(self, destination: str, limit: int) -> tuple[str, list[tuple[dict, DeadLetter]]]:
        url = self._client.get_queue_url(QueueName=topology.dead_letter_queue_name(destination))[
            "QueueUrl"
        ]
        taken: list[tuple[dict, DeadLetter]] = []
        while len(taken) < limit:
            messages = self._client.receive_message(
                QueueUrl=url,
                MaxNumberOfMessages=min(MAX_RECEIVE, limit - len(taken)),
                WaitTimeSeconds=0,
                VisibilityTimeout=PEEK_VISIBILITY,
                MessageAttributeNames=["All"],
            ).get("Messages", [])
            if not messages:
                break
            for message in messages:
                attributes = message.get("MessageAttributes", {})
                error = {
                    name: value.get("StringValue", "")
                    for name, value in attributes.items()
                    if name.startswith("x-error-")
                }
                letter = DeadLetter(
                    destination, message["Body"].encode(), error, message.get("MessageId")
                )
                taken.append((message, letter))
        return url, taken

    def _show_again(self, url: str, messages: list[dict]) -> None:
        for message in messages:
            self._client.change_message_visibility(
                QueueUrl=url, ReceiptHandle=message["ReceiptHandle"], VisibilityTimeout=0
            )

    def count(self, destination: str) -> int:
        url = self._client.get_queue_url(QueueName=topology.dead_letter_queue_name(destination))[
            "QueueUrl"
        ]
        attributes = self._client.get_queue_attributes(
            QueueUrl=url,
            AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )["Attributes"]
        # Messages this box is looking at right now are hidden, not gone: count them too.
        return int(attributes.get("ApproximateNumberOfMessages", 0)) + int(
            attributes.get("ApproximateNumberOfMessagesNotVisible", 0)
        )

    def peek(self, destination: str, limit: int) -> list[DeadLetter]:
        url, taken = self._take(destination, limit)
        self._show_again(url, [message for message, _ in taken])
        return [letter for _, letter in taken]

    def requeue(
        self,
        destination: str,
        choose: Callable[[DeadLetter], bool],
        limit: int,
        before_send: Callable[[DeadLetter], None] | None = None,
    ) -> list[DeadLetter]:
        url, taken = self._take(destination, limit)
        target = self._client.get_queue_url(QueueName=topology.queue_name(destination))["QueueUrl"]
        sent, left = [], []
        for message, letter in taken:
            if not choose(letter):
                left.append(message)
                continue
            attributes = {
                name: value
                for name, value in message.get("MessageAttributes", {}).items()
                if not name.startswith("x-error-") and name != "x-original-queue"
            }
            kwargs = {"MessageAttributes": attributes} if attributes else {}
            if before_send is not None:
                before_send(letter)
            self._client.send_message(QueueUrl=target, MessageBody=message["Body"], **kwargs)
            self._client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            sent.append(letter)
        self._show_again(url, left)
        return sent

    def discard(
        self, destination: str, choose: Callable[[DeadLetter], bool], limit: int
    ) -> list[DeadLetter]:
        url, taken = self._take(destination, limit)
        discarded, left = [], []
        for message, letter in taken:
            if not choose(letter):
                left.append(message)
                continue
            self._client.delete_message(QueueUrl=url, ReceiptHandle=message["ReceiptHandle"])
            discarded.append(letter)
        self._show_again(url, left)
        return discarded

    def close(self) -> None:
        self._client.close()
