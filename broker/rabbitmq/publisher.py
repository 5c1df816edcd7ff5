"""RabbitMQ through pika: topic exchange, quorum queues, pipelined publisher confirms.

Publishing one message and waiting for its confirm costs a network round trip and a
disk sync each; pika's ``BlockingChannel.confirm_delivery()`` does exactly that. So
the relay drives a ``SelectConnection`` itself: it writes a whole batch to the socket,
then runs the I/O loop until the broker has acked (or nacked) every delivery tag,
``multiple=True`` acks settling many at once. Only acked messages count as sent.

A refusal of one message is that message's fault, whatever form the broker gives it: a
nack, a return (unroutable), or the publishing channel closed over it (``406
PRECONDITION_FAILED`` for a message over ``max_message_size``). After such a close the
connection opens a new channel and publishes the messages still unanswered one at a
time, so that the next close names its culprit; the rest goes on pipelined. Only a lost
connection, or a close that no message explains, is an outage. A ``404 NOT_FOUND`` (the
exchange is gone: a node reset, a new cluster) declares the topology again and resends.

A connection the broker blocks (``connection.blocked``: a memory or disk alarm) is flow
control, not an outage: it is kept, the batch's answers are waited for as long as the block
lasts, and nothing is published again; the log and ``hubdommed_broker_publishing_blocked``
say so.

The topology it declares is ``broker.rabbitmq.topology``'s, the connection parameters
``broker.rabbitmq.connection``'s: the consumer and the dead-letter box use the same.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions
from django.conf import settings
from pika import spec

from broker import topology
from broker.base import (
    OutgoingMessage,
    PendingSend,
    SendResult,
    Transport,
    TransportUnavailable,
)
from broker.metrics import PUBLISHING_BLOCKED
from broker.rabbitmq.connection import (
    ANSWER_TIMEOUT,
    CONNECT_FAILURES,
    CONNECT_TIMEOUT,
    connection_parameters,
    node_failed,
)
from broker.rabbitmq.topology import TopologyError, declarations, exchange_declaration
from broker.topology import QUEUES
from lifecycle import conditions

logger = logging.getLogger("hubdommed.relay")

# Channel closes that one published message causes (AMQP reply codes): that message is
# refused, the others are not at fault. 406 PRECONDITION_FAILED: over max_message_size (or
# a property the broker will not take); 311 CONTENT_TOO_LARGE; 312 NO_ROUTE.
MESSAGE_FAULTS = frozenset({311, 312, 406})
NOT_FOUND = 404
# Seconds between the signs of life of a wait the broker holds (a blocked connection).
HELD_SLICE = 1.0

# pika reports a connection the broker dropped at ERROR with a stack; the transport reports
# the same event once, as the reconnect it is (a warning), so theirs only adds noise.
for _noisy in ("pika.adapters.utils.io_services_utils", "pika.adapters.base_connection"):
    logging.getLogger(_noisy).setLevel(logging.CRITICAL)


def message_properties(message: OutgoingMessage) -> pika.BasicProperties:
    headers = {"type": message.task, "correlation_id": message.correlation_id}
    if message.event:
        headers["event"] = message.event
    return pika.BasicProperties(
        content_type="application/json",
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=message.run_id,
        type=message.task,
        correlation_id=message.correlation_id or None,
        headers=headers,
    )


def republished_properties(
    original: pika.BasicProperties, headers: dict[str, Any]
) -> pika.BasicProperties:
    """The properties of a received message published again (to its dead-letter queue, or
    back to its queue): the same message, persistent, with ``headers`` instead of its own."""
    return pika.BasicProperties(
        content_type=original.content_type,
        delivery_mode=pika.DeliveryMode.Persistent,
        message_id=original.message_id,
        type=original.type,
        correlation_id=original.correlation_id,
        headers=headers,
    )


class _CorkedConnection(pika.SelectConnection):
    """A ``SelectConnection`` that can hold back the frames it writes and hand them to the
    socket as one buffer: pika gives each frame (a message is three: method, header, body)
    its own ``send``; a corked batch of 500 messages goes out in one call, or as few as
    the socket's buffer allows."""

    _cork: list[bytes] | None = None

    def _adapter_emit_data(self, data: bytes) -> None:
        if self._cork is not None:
            self._cork.append(data)
        else:
            super()._adapter_emit_data(data)

    @contextlib.contextmanager
    def corked(self):
        self._cork = []
        try:
            yield
        finally:
            frames, self._cork = self._cork, None
            if frames:
                super()._adapter_emit_data(b"".join(frames))


class _Publisher:
    """A channel in confirm mode and the answers it waits for: one batch at a time."""

    def __init__(self, conn: _Connection) -> None:
        self.conn = conn
        self.channel: Any = None
        # Taken by a batch from ``RabbitMQTransport.begin`` until its answers are collected.
        self.busy = False
        # Delivery tag -> message, answers collected by the callbacks into ``result``.
        self.tag = 0
        self.outstanding: dict[int, OutgoingMessage] = {}
        self.returned: dict[str, str] = {}
        self.result = SendResult()
        # Why the broker closed the channel (reply code, text), if it did.
        self.closed: tuple[int, str] | None = None
        # The broker nacked a message on this channel (see ``retire``).
        self.nacked = False
        self.retired: Any = None
        self.open()

    def open(self) -> None:
        """A new channel in confirm mode (delivery tags start again at 1)."""
        self.tag = 0
        self.outstanding = {}
        self.closed = None
        self.nacked = False
        self.channel = self.conn.open_channel(on_close=self._on_close)
        confirmed: list[Any] = []
        self.channel.confirm_delivery(
            self._on_confirm, callback=lambda frame: (confirmed.append(frame), self.conn.wake())
        )
        self.channel.add_on_return_callback(self._on_return)
        self.conn.run_until(lambda: bool(confirmed), CONNECT_TIMEOUT)

    @property
    def is_open(self) -> bool:
        return self.channel.is_open

    def retire(self) -> None:
        """Close the channel: the next batch opens another.

        A quorum queue whose leader was lost nacks what is published to it until a new
        leader is elected, and a channel that published into it meanwhile goes on being
        nacked long after (RabbitMQ 3.10: over a minute, where a new channel is acked at
        once). So a channel that was nacked is not used again.
        """
        self.retired = self.channel
        with contextlib.suppress(pika.exceptions.AMQPError):
            self.channel.close()

    def answered(self) -> bool:
        return not self.outstanding or self.closed is not None

    def write(self, messages: Sequence[OutgoingMessage], result: SendResult) -> None:
        """Hand the messages to the socket, in one buffer, without waiting for answers."""
        self.result = result
        self.returned = {}
        exchange = settings.RABBITMQ_EXCHANGE
        publish = self.channel.basic_publish
        outstanding = self.outstanding
        try:
            with self.conn.connection.corked():
                for message in messages:
                    publish(
                        exchange,
                        topology.routing_key(message.destination, message.task),
                        message.body,
                        message_properties(message),
                        # Unroutable messages come back (Basic.Return) instead of vanishing.
                        mandatory=True,
                    )
                    self.tag += 1
                    outstanding[self.tag] = message
        except pika.exceptions.ChannelWrongStateError:
            # Closed under us while writing: the close's reason is on its way, and
            # ``collect`` waits for it.
            pass
        except pika.exceptions.AMQPError as exc:
            self.conn.error = self.conn.error or f"RabbitMQ publish failed: {exc!r}"
            raise TransportUnavailable(self.conn.error) from exc

    def collect(
        self, messages: Sequence[OutgoingMessage]
    ) -> tuple[tuple[int, str] | None, list[OutgoingMessage]]:
        """Wait until each message ``write`` took is answered or the channel closes: (why
        it closed or None, the messages left unanswered in order)."""
        if self.channel.is_closing or self.channel.is_closed:
            self.conn.run_until(lambda: self.closed is not None, CONNECT_TIMEOUT)
        else:
            self.conn.run_until(self.answered, ANSWER_TIMEOUT)
        unanswered = list(self.outstanding.values())
        self.outstanding.clear()
        if self.closed is None:
            return None, unanswered
        # The written-but-unsent tail is in ``messages`` after the unanswered ones.
        answered = set(self.result.sent) | set(self.result.rejected)
        return self.closed, [m for m in messages if m.key not in answered]

    def _on_close(self, channel, reason: BaseException) -> None:
        if channel is self.retired:
            return  # closed by us, nothing lost with it
        # The outstanding confirms are lost with it; ``publish`` sorts out why.
        self.closed = (
            getattr(reason, "reply_code", 0),
            getattr(reason, "reply_text", "") or repr(reason),
        )
        self.conn.connection.ioloop.stop()

    def _on_return(self, _channel, method, properties, _body) -> None:
        self.returned[properties.message_id] = f"unroutable: {method.reply_text}"

    def _on_confirm(self, frame) -> None:
        method = frame.method
        acked = isinstance(method, spec.Basic.Ack)
        tag = method.delivery_tag
        outstanding = self.outstanding
        settled = []
        if method.multiple:
            while outstanding:
                first = next(iter(outstanding))
                if first > tag:
                    break
                settled.append(outstanding.pop(first))
        elif tag in outstanding:
            settled.append(outstanding.pop(tag))
        result = self.result
        for message in settled:
            reason = self.returned.pop(message.run_id, None)
            if acked and reason is None:
                result.sent.append(message.key)
            else:
                result.rejected[message.key] = reason or "nacked by RabbitMQ"
                self.nacked = self.nacked or reason is None
        if not outstanding:
            self.conn.wake()


class _Connection:
    """A ``SelectConnection`` used synchronously: each call runs the I/O loop until the
    answer it needs has arrived, the connection failed, or time ran out. Confirms of every
    channel are handled whichever answer the loop is waiting for, so batches published on
    two channels are answered while the relay waits for either."""

    def __init__(
        self, params: pika.URLParameters, on_held: Callable[[], None] | None = None
    ) -> None:
        self.error: str | None = None
        self._on_held = on_held
        self._until: Callable[[], bool] | None = None
        # When the I/O loop last ran: heartbeats flow only while it runs.
        self._last_io = time.monotonic()
        self._topology_channel: Any = None
        self._channel_error: str | None = None
        # Since when the broker blocks this connection (a memory or disk alarm), or None.
        self.blocked_since: float | None = None
        self.unblocked_at: float | None = None
        # Flow control is not an outage: pika must not close a blocked connection (its
        # confirms are on their way once the alarm clears, and a new connection would
        # publish the same messages again).
        params.blocked_connection_timeout = None
        self.connection = _CorkedConnection(
            params,
            on_open_callback=lambda _c: self.wake(),
            on_open_error_callback=self._on_open_error,
            on_close_callback=self._on_close,
        )
        self.connection.add_on_connection_blocked_callback(self._on_blocked)
        self.connection.add_on_connection_unblocked_callback(self._on_unblocked)
        self.run_until(lambda: self.connection.is_open, CONNECT_TIMEOUT)
        self._publishers: list[_Publisher] = []
        self.free_publisher()  # the first batch finds its channel open

    def free_publisher(self) -> _Publisher:
        """A publishing channel no batch is using (opened if all are)."""
        for publisher in self._publishers:
            if not publisher.busy:
                return publisher
        publisher = _Publisher(self)
        self._publishers.append(publisher)
        return publisher

    # -- the I/O loop ------------------------------------------------------------------------

    def run_until(self, done: Callable[[], bool], timeout: float) -> None:
        ioloop = self.connection.ioloop
        deadline = time.monotonic() + timeout
        while not done():
            if self.error:
                raise TransportUnavailable(self.error)
            remaining = deadline - time.monotonic()
            if remaining <= 0 and self.blocked_since is not None:
                # Blocked: what was written stays written and its answers come when the
                # alarm clears. The wait goes on, each round as long as the first.
                deadline = time.monotonic() + timeout
                remaining = timeout
            elif remaining <= 0 and self.unblocked_at is not None:
                # Unblocked meanwhile: the whole wait again from then, for the backlog the
                # broker now works through.
                deadline = max(deadline, self.unblocked_at + timeout)
                remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.error = f"RabbitMQ did not answer within {timeout:g} s"
                raise TransportUnavailable(self.error)
            held = self.blocked_since is not None
            if held:
                # A second at a time, each one a sign of life: blocked is not hung.
                remaining = min(remaining, HELD_SLICE)
            self._until = done
            timer = ioloop.call_later(remaining, ioloop.stop)
            try:
                ioloop.start()
            finally:
                ioloop.remove_timeout(timer)
                self._until = None
                self._last_io = time.monotonic()
            if held and self._on_held is not None:
                self._on_held()

    def poll(self) -> None:
        """Run the I/O loop once without waiting: write what is buffered, handle whatever
        the broker sent."""
        ioloop = self.connection.ioloop
        ioloop.call_later(0, ioloop.stop)
        try:
            ioloop.start()
        finally:
            self._last_io = time.monotonic()

    def wake(self) -> None:
        if self._until is not None and (self.error or self._until()):
            self.connection.ioloop.stop()

    def _on_blocked(self, _connection, frame) -> None:
        self.blocked_since = time.monotonic()
        PUBLISHING_BLOCKED.set(1)
        reason = getattr(frame.method, "reason", "") or "an alarm"
        conditions.degraded("rabbitmq", f"publishing blocked by the broker ({reason})")
        logger.warning(
            "RabbitMQ blocked this connection (%s): publishing is held until it unblocks; "
            "what was written stays written, nothing is sent twice",
            reason,
        )
        # The wait under way goes on a second at a time, each one a sign of life.
        self.connection.ioloop.stop()

    def _on_unblocked(self, _connection, _frame) -> None:
        since, self.blocked_since = self.blocked_since, None
        self.unblocked_at = time.monotonic()
        PUBLISHING_BLOCKED.set(0)
        conditions.recovered("rabbitmq")
        held = time.monotonic() - since if since is not None else 0.0
        logger.info("RabbitMQ unblocked this connection after %.1f s: publishing again", held)

    def _on_open_error(self, _connection, exc: BaseException) -> None:
        self.error = f"cannot connect to RabbitMQ: {exc!r}"
        self.connection.ioloop.stop()

    def _on_close(self, _connection, reason: BaseException) -> None:
        self.error = self.error or f"RabbitMQ connection closed: {reason!r}"
        if self.blocked_since is not None:
            self.blocked_since = None
            PUBLISHING_BLOCKED.set(0)
            conditions.recovered("rabbitmq")
        self.connection.ioloop.stop()

    @property
    def usable(self) -> bool:
        if self.error is not None or not self.connection.is_open or self.silent_too_long:
            return False
        # Read what arrived while the relay was away: a close the broker sent meanwhile
        # (a restart, a reset, an operator) is found here, not by the next batch.
        self.poll()
        return self.error is None and self.connection.is_open

    @property
    def silent_too_long(self) -> bool:
        """Whether the broker may have dropped us for missing heartbeats.

        The I/O loop (and with it the heartbeats) only runs while the relay talks to the
        broker; between batches the relay waits on Redis, however long the outbox stays
        empty. A connection left silent for more than half the negotiated heartbeat is
        replaced before use, rather than found dead by the next batch (which would then
        count as an outage and wait before its retry).
        """
        heartbeat = self.connection.params.heartbeat
        if not heartbeat:
            return False
        return time.monotonic() - self._last_io > heartbeat / 2

    def close(self) -> None:
        if self.connection.is_open:
            self.connection.close()
            with contextlib.suppress(TransportUnavailable):
                self.run_until(lambda: self.connection.is_closed, CONNECT_TIMEOUT)

    # -- channels and declarations --------------------------------------------------------------

    def open_channel(self, on_close: Callable[[Any, BaseException], None] | None = None) -> Any:
        opened: list[Any] = []
        self.connection.channel(on_open_callback=lambda ch: (opened.append(ch), self.wake()))
        self.run_until(lambda: bool(opened), CONNECT_TIMEOUT)
        channel = opened[0]
        channel.add_on_close_callback(on_close or self._on_topology_close)
        return channel

    def _on_topology_close(self, channel, reason: BaseException) -> None:
        if channel is self._topology_channel:
            self._channel_error = str(reason)
        self.connection.ioloop.stop()

    def declare(self, method: str, kwargs: dict[str, Any]) -> None:
        if self._topology_channel is None or not self._topology_channel.is_open:
            self._channel_error = None
            self._topology_channel = self.open_channel()
        channel = self._topology_channel
        answers: list[Any] = []
        getattr(channel, method)(
            callback=lambda frame: (answers.append(frame), self.wake()), **kwargs
        )
        self.run_until(lambda: bool(answers) or self._channel_error is not None, CONNECT_TIMEOUT)
        if not answers:
            raise TopologyError(f"{method} {kwargs}: {self._channel_error}")

    # -- publishing --------------------------------------------------------------------------

    def publish(
        self,
        publisher: _Publisher,
        messages: Sequence[OutgoingMessage],
        result: SendResult,
        redeclare: Callable[[Sequence[OutgoingMessage]], None],
        *,
        written: bool = False,
    ) -> None:
        """Publish on ``publisher`` and collect the broker's answer to each message.

        Answers go into ``result``. Pipelined while the broker takes them; after the
        channel closed over a message, the unanswered ones go one at a time until the next
        close names its culprit (the broker handles a channel's messages in order, so the
        culprit is the first message whose publish closes the channel), then pipelined
        again. ``written``: the messages were handed to the channel already (``begin``),
        only their answers are left to collect. Raises ``TransportUnavailable`` only for
        an outage: the caller counts what is left. ``redeclare`` declares the exchange and
        the messages' queues again, after a 404.
        """
        pending = list(messages)
        one_at_a_time = False
        redeclared = False
        while pending:
            if written:
                batch, written = pending, False
            else:
                if not publisher.is_open:
                    publisher.open()
                batch = pending[:1] if one_at_a_time else pending
                publisher.write(batch, result)
            closed, unanswered = publisher.collect(batch)
            pending = unanswered + pending[len(batch) :]
            if closed is None:
                continue
            code, text = closed
            if code == NOT_FOUND and not redeclared:
                logger.warning("RabbitMQ: %s; declaring the topology again", text)
                redeclare(pending)
                redeclared = True
            elif code in MESSAGE_FAULTS and one_at_a_time and unanswered:
                culprit = unanswered[0]
                result.rejected[culprit.key] = f"refused by RabbitMQ: ({code}) {text}"
                pending.remove(culprit)
                # Whatever followed it was dropped unread: pipelined again.
                one_at_a_time = False
            elif code in MESSAGE_FAULTS:
                one_at_a_time = True
            else:
                raise TransportUnavailable(
                    f"RabbitMQ closed the publishing channel: ({code}) {text}"
                )
        if publisher.nacked:
            publisher.retire()


class _InFlight(PendingSend):
    """A batch written to a channel of its own, its confirms still on their way."""

    def __init__(
        self,
        transport: RabbitMQTransport,
        conn: _Connection,
        publisher: _Publisher,
        messages: list[OutgoingMessage],
        result: SendResult,
    ) -> None:
        super().__init__(result)
        self._transport = transport
        self._conn = conn
        self._publisher = publisher
        self._messages = messages
        self._done = False

    def result(self) -> SendResult:
        if self._done:
            return self._result
        self._done = True
        result = self._result
        try:
            self._conn.publish(
                self._publisher,
                self._messages,
                result,
                self._transport._redeclare,
                written=True,
            )
        except TransportUnavailable as exc:
            settled = set(result.sent) | set(result.rejected)
            result.unconfirmed = [m.key for m in self._messages if m.key not in settled]
            result.error = str(exc)
            self._transport._lost(self._conn)
        finally:
            self._publisher.busy = False
        return result


class RabbitMQTransport(Transport):
    name = "rabbitmq"
    # Two batches in flight, each on a channel of its own: one is written (and the next
    # claimed) while the broker confirms the other.
    max_in_flight = 2

    def __init__(self) -> None:
        self._conn: _Connection | None = None
        # Declared on the current connection. A new connection may reach a broker that lost
        # its definitions (a reset node, a new cluster): it declares everything again.
        self._declared: set[str] = set()

    def _connection(self) -> _Connection:
        if self._conn is not None and self._conn.usable:
            return self._conn
        if self._conn is not None and (self._conn.error or not self._conn.connection.is_open):
            logger.warning("RabbitMQ connection lost (%s); reconnecting", self._conn.error)
            node_failed(self._conn.connection.params)
        elif self._conn is not None:
            # Silent for longer than half its heartbeat: replaced before use, as planned.
            logger.debug("replacing a RabbitMQ connection idle past its heartbeat")
        self.close()
        params = connection_parameters()
        try:
            self._conn = _Connection(params, on_held=self.on_held)
        except (pika.exceptions.AMQPError, *CONNECT_FAILURES) as exc:
            node_failed(params)
            raise TransportUnavailable(f"cannot connect to RabbitMQ: {exc!r}") from exc
        except TransportUnavailable:
            node_failed(params)
            raise
        self._declared = set()
        method, kwargs = exchange_declaration()
        self._declare(method, kwargs)
        self._declared.add("")
        return self._conn

    def _redeclare(self, messages: Sequence[OutgoingMessage]) -> None:
        """The broker lost the exchange (404): declare it and the messages' queues again."""
        self._declared = set()
        method, kwargs = exchange_declaration()
        self._declare(method, kwargs)
        self._declared.add("")
        for destination in dict.fromkeys(m.destination for m in messages):
            try:
                self.ensure_destination(destination)
            except (topology.UnknownDestination, TopologyError):
                continue  # refused again when published, that message alone

    def _declare(self, method: str, kwargs: dict[str, Any]) -> None:
        try:
            self._conn.declare(method, kwargs)
        except pika.exceptions.AMQPError as exc:
            raise TransportUnavailable(f"RabbitMQ declaration failed: {exc!r}") from exc

    def setup_topology(self) -> None:
        self._connection()
        for queue_class in QUEUES:
            self.ensure_destination(queue_class)

    def ensure_destination(self, destination: str) -> None:
        if destination in self._declared:
            return
        topology.check_destination(destination)
        self._connection()
        for method, kwargs in declarations(destination):
            self._declare(method, kwargs)
        self._declared.add(destination)

    def send(self, messages: Sequence[OutgoingMessage]) -> SendResult:
        return self.begin(messages).result()

    def begin(self, messages: Sequence[OutgoingMessage]) -> PendingSend:
        """Write the batch on a free channel and return without waiting for its confirms."""
        result = SendResult()
        if not messages:
            return PendingSend(result)
        try:
            conn = self._connection()
        except TransportUnavailable as exc:
            return PendingSend(SendResult(unconfirmed=[m.key for m in messages], error=str(exc)))
        publishable: list[OutgoingMessage] = []
        refused: dict[str, str] = {}
        for message in messages:
            destination = message.destination
            if destination not in self._declared and destination not in refused:
                try:
                    self.ensure_destination(destination)
                except (topology.UnknownDestination, TopologyError) as exc:
                    refused[destination] = str(exc)
                except TransportUnavailable as exc:
                    return PendingSend(
                        SendResult(unconfirmed=[m.key for m in messages], error=str(exc))
                    )
            if destination in refused:
                result.rejected[message.key] = refused[destination]
            else:
                publishable.append(message)
        # Declaring may have replaced a connection found dead meanwhile.
        conn = self._conn or conn
        try:
            publisher = conn.free_publisher()
            publisher.busy = True
        except TransportUnavailable as exc:
            result.unconfirmed = [m.key for m in publishable]
            result.error = str(exc)
            self._lost(conn)
            return PendingSend(result)
        flight = _InFlight(self, conn, publisher, publishable, result)
        try:
            if not publisher.is_open:
                publisher.open()
            publisher.write(publishable, result)
            # Out to the socket now, not when the answers are awaited: the broker works on
            # this batch while the relay claims the next.
            conn.poll()
        except TransportUnavailable:
            pass  # ``result()`` finds the connection failed and counts what is left
        return flight

    def _lost(self, conn: _Connection) -> None:
        """A connection failed under a batch: dropped, if it is still the current one."""
        if conn is self._conn:
            self.close()

    def close(self) -> None:
        if self._conn is not None:
            conn, self._conn = self._conn, None
            try:
                conn.close()
            except Exception:  # closing a broken connection: nothing left to save
                logger.debug("error closing the RabbitMQ connection", exc_info=True)
