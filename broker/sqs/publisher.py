"""Amazon SQS through boto3: one queue per destination, each with its dead-letter queue.

``SendMessageBatch`` takes at most 10 entries and 256 KiB per call (bodies plus message
attributes), so a batch is cut into calls that respect both. SQS answers per entry: the
entries it refused stay pending (and back off) while the others are marked sent. A call
refused as a whole (other than for an outage) is cut in halves until the refusal names
one entry: only that one backs off.

The body is the row's ``envelope::text``, which SQS may refuse where PostgreSQL did not: a
character outside SQS's set (PostgreSQL writes U+FFFE and U+FFFF in a string as they are)
goes as its JSON escape, the same document; and a body over 256 KiB goes without the
space PostgreSQL writes after each comma and colon, which ``dispatch`` did not count (its
limit is on the compact document): a queue of 256 KiB takes what ``dispatch`` took.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from django.conf import settings

from broker import topology
from broker.base import OutgoingMessage, SendResult, Transport, TransportUnavailable
from broker.topology import QUEUES

logger = logging.getLogger("hubdommed.relay")

MAX_BATCH_ENTRIES = 10
MAX_BATCH_BYTES = 256 * 1024
TIMEOUT = 10.0
_ALREADY_EXISTS = {
    "QueueAlreadyExists",
    "QueueNameExists",
    "AWS.SimpleQueueService.QueueNameExists",
}


def sqs_client(
    *, timeout: float = TIMEOUT, read_timeout: float | None = None, attempts: int = 2
) -> Any:
    """A client for ``settings.SQS_ENDPOINT_URL`` (None: the real AWS) with short timeouts
    (``read_timeout``: a longer wait for an answer, as a long poll's)."""
    return boto3.client(
        "sqs",
        region_name=settings.AWS_REGION,
        endpoint_url=settings.SQS_ENDPOINT_URL,
        config=Config(
            connect_timeout=timeout,
            read_timeout=read_timeout or timeout,
            retries={"max_attempts": attempts, "mode": "standard"},
            max_pool_connections=10,
        ),
    )


# What SQS refuses in a body or an attribute string: anything but tab, LF, CR, U+0020 to
# U+D7FF, U+E000 to U+FFFD and U+10000 to U+10FFFF.
REFUSED_BY_SQS = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
# In ``jsonb::text``: a string (kept as it is), or a separator PostgreSQL spells with a space.
_JSONB_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|([,:]) ')


def sqs_body(body: bytes) -> str:
    """An outbox row's JSON document as SQS takes it: the same document, its characters
    SQS refuses escaped (in a JSON document they can only be inside strings), compacted
    when over 256 KiB."""
    text = body.decode()
    if len(body) > MAX_BATCH_BYTES:
        text = _JSONB_TOKEN.sub(lambda match: match.group(1) or match.group(0), text)
    return REFUSED_BY_SQS.sub(lambda match: f"\\u{ord(match.group()):04x}", text)


def sqs_text(text: str) -> str:
    """An attribute string as SQS takes it: each character it refuses as U+FFFD."""
    return REFUSED_BY_SQS.sub("\ufffd", text)


def queue_attributes(destination: str, dead_letter_arn: str) -> dict[str, str]:
    return {
        "VisibilityTimeout": str(topology.VISIBILITY_TIMEOUT[topology.queue_class(destination)]),
        "RedrivePolicy": json.dumps(
            {"deadLetterTargetArn": dead_letter_arn, "maxReceiveCount": topology.MAX_RECEIVES}
        ),
    }


def dead_letter_queue_attributes() -> dict[str, str]:
    return {"MessageRetentionPeriod": str(topology.DEAD_LETTER_RETENTION_SECONDS)}


def _attributes(message: OutgoingMessage) -> dict[str, dict[str, str]]:
    attributes = {"type": {"DataType": "String", "StringValue": message.task}}
    if message.correlation_id:
        attributes["correlation_id"] = {
            "DataType": "String",
            "StringValue": sqs_text(message.correlation_id),
        }
    return attributes


def _attributes_size(attributes: dict[str, dict[str, str]]) -> int:
    # How SQS counts them: name, data type and value, in bytes.
    return sum(
        len(name.encode()) + len(value["DataType"].encode()) + len(value["StringValue"].encode())
        for name, value in attributes.items()
    )


def batch_entries(
    messages: Sequence[OutgoingMessage],
) -> Iterator[list[tuple[OutgoingMessage, dict[str, Any]]]]:
    """Cut messages into ``SendMessageBatch`` calls of at most 10 entries and 256 KiB."""
    call: list[tuple[OutgoingMessage, dict[str, Any]]] = []
    call_bytes = 0
    for message in messages:
        body = sqs_body(message.body)
        entry: dict[str, Any] = {"MessageBody": body}
        size = len(body.encode())
        attributes = _attributes(message)
        # The envelope already carries type and correlation id; the attributes are a
        # convenience that must not push a message near the limit over it.
        if size + _attributes_size(attributes) <= MAX_BATCH_BYTES:
            entry["MessageAttributes"] = attributes
            size += _attributes_size(attributes)
        if call and (len(call) == MAX_BATCH_ENTRIES or call_bytes + size > MAX_BATCH_BYTES):
            yield call
            call, call_bytes = [], 0
        entry["Id"] = str(len(call))
        call.append((message, entry))
        call_bytes += size
    if call:
        yield call


# Credentials SQS does not take stop every call, whatever it carries: not one message's
# fault, but SQS out of reach until they are good again (a role's token renewed).
_CREDENTIALS_REFUSED = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "InvalidSecurity",
    "MissingAuthenticationToken",
    "RequestExpired",
    "SignatureDoesNotMatch",
    "UnrecognizedClientException",
}


def _is_outage(exc: Exception) -> bool:
    if isinstance(exc, BotoCoreError):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
        code = exc.response.get("Error", {}).get("Code", "")
        return (
            status >= 500
            or "Throttl" in code
            or code == "RequestThrottled"
            or code in _CREDENTIALS_REFUSED
        )
    return False


class SQSTransport(Transport):
    name = "sqs"

    def __init__(self) -> None:
        self._client: Any = None
        # destination -> queue URL, for the life of the transport.
        self._urls: dict[str, str] = {}

    @property
    def client(self) -> Any:
        if self._client is None:
            self._client = sqs_client()
        return self._client

    def setup_topology(self) -> None:
        for queue_class in QUEUES:
            self.ensure_destination(queue_class)

    def ensure_destination(self, destination: str) -> None:
        self.queue_url(destination)

    def queue_url(self, destination: str) -> str:
        url = self._urls.get(destination)
        if url is not None:
            return url
        topology.check_destination(destination)
        try:
            dead_letter_url = self._create_queue(
                topology.dead_letter_queue_name(destination), dead_letter_queue_attributes()
            )
            arn = self.client.get_queue_attributes(
                QueueUrl=dead_letter_url, AttributeNames=["QueueArn"]
            )["Attributes"]["QueueArn"]
            url = self._create_queue(
                topology.queue_name(destination), queue_attributes(destination, arn)
            )
        except (BotoCoreError, ClientError) as exc:
            if _is_outage(exc):
                raise TransportUnavailable(f"SQS unreachable: {exc}") from exc
            raise
        self._urls[destination] = url
        return url

    def _create_queue(self, name: str, attributes: dict[str, str]) -> str:
        try:
            return self.client.create_queue(QueueName=name, Attributes=attributes)["QueueUrl"]
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _ALREADY_EXISTS:
                raise
        # It exists with other attributes (an older timeout, say): bring it up to date.
        url = self.client.get_queue_url(QueueName=name)["QueueUrl"]
        self.client.set_queue_attributes(QueueUrl=url, Attributes=attributes)
        return url

    def send(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        result = SendResult()
        by_destination: dict[str, list[OutgoingMessage]] = {}
        for message in messages:
            by_destination.setdefault(message.destination, []).append(message)
        done: set[int] = set()
        try:
            for destination, group in by_destination.items():
                try:
                    url = self.queue_url(destination)
                except (topology.UnknownDestination, ClientError) as exc:
                    for message in group:
                        result.rejected[message.key] = str(exc)
                        done.add(message.key)
                    continue
                for call in batch_entries(group):
                    self._send_call(url, call, result)
                    done.update(message.key for message, _ in call)
        except TransportUnavailable as exc:
            result.unconfirmed = [m.key for m in messages if m.key not in done]
            result.error = str(exc)
        return result

    def _send_call(
        self, url: str, call: list[tuple[OutgoingMessage, dict[str, Any]]], result: SendResult
    ) -> None:
        try:
            response = self.client.send_message_batch(
                QueueUrl=url, Entries=[entry for _, entry in call]
            )
        except (BotoCoreError, ClientError) as exc:
            if _is_outage(exc):
                raise TransportUnavailable(f"SQS unreachable: {exc}") from exc
            if len(call) > 1:
                # The call as a whole was refused (BatchRequestTooLong, say): not every
                # entry's fault. Halves until the refusal names one entry; the others go.
                middle = len(call) // 2
                self._send_call(url, call[:middle], result)
                self._send_call(url, call[middle:], result)
                return
            ((message, _),) = call
            result.rejected[message.key] = f"SQS refused the message: {exc}"
            return
        by_id = {entry["Id"]: message for message, entry in call}
        for ok in response.get("Successful", []):
            result.sent.append(by_id[ok["Id"]].key)
        for failed in response.get("Failed", []):
            result.rejected[by_id[failed["Id"]].key] = (
                f"SQS refused the message: {failed.get('Code')} {failed.get('Message', '')}"
            )

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
