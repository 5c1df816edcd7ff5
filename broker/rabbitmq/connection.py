"""How every RabbitMQ connection of the project is opened: one attempt, bounded waits.

The publisher, the consumer, the dead-letter box and the health check all connect this
way, so that a broker that does not answer costs each of them the same few seconds and
then a clear error, never a hang. ``RABBITMQ_URL`` may list a cluster's nodes; a lost or
refused connection moves the process on to the next one.
"""

from __future__ import annotations

import logging
import threading
from urllib.parse import urlsplit

import pika
from django.conf import settings
from pika.adapters.utils.connection_workflow import (
    AMQPConnectionWorkflowFailed,
    AMQPConnectorException,
)

logger = logging.getLogger("hubdommed.broker")

# What pika's connection workflow raises, besides its own ``AMQPError`` family, when a
# connection cannot be opened: its connector's errors, a socket's, and a ValueError when the
# TCP connection is reset as it opens (its stream connector's getpeername() check fails:
# seen as a cluster node was killed). Each is the broker unreachable, never a crash.
CONNECT_FAILURES = (AMQPConnectorException, AMQPConnectionWorkflowFailed, OSError, ValueError)

# Seconds to wait for the broker to open a connection or answer a batch.
CONNECT_TIMEOUT = 5.0
ANSWER_TIMEOUT = 30.0


def broker_nodes(url: str | None = None) -> list[str]:
    """The nodes of ``url`` (``RABBITMQ_URL`` by default): one amqp:// URL, or a cluster's
    several, comma-separated in the order to try."""
    return [node.strip() for node in (url or settings.RABBITMQ_URL).split(",") if node.strip()]


# Per node list, the index of the node this process connects to next. A connection lost or
# refused moves it on (``node_failed``): the daemons' backoff then tries the next node, and
# the list wraps around.
_next_node: dict[tuple[str, ...], int] = {}
_next_node_lock = threading.Lock()


def _current_node(nodes: list[str]) -> str:
    return nodes[_next_node.get(tuple(nodes), 0) % len(nodes)]


def node_failed(params: pika.ConnectionParameters, url: str | None = None) -> None:
    """The connection made with ``params`` was refused or lost: the next connection of this
    process goes to the next node of the list (when ``params`` are still the current one's)."""
    nodes = broker_nodes(url)
    if len(nodes) < 2:
        return
    with _next_node_lock:
        index = _next_node.get(tuple(nodes), 0) % len(nodes)
        current = pika.URLParameters(nodes[index])
        if (current.host, current.port) == (params.host, params.port):
            _next_node[tuple(nodes)] = (index + 1) % len(nodes)
            logger.warning(
                "RabbitMQ node %s:%s unavailable; the next connection goes to %s",
                params.host,
                params.port,
                _address(nodes[(index + 1) % len(nodes)]),
            )


def _address(node: str) -> str:
    parsed = urlsplit(node)
    return f"{parsed.hostname}:{parsed.port or 5672}"


def _bounded(params: pika.URLParameters) -> pika.URLParameters:
    params.connection_attempts = 1
    params.retry_delay = 0
    params.socket_timeout = CONNECT_TIMEOUT
    params.stack_timeout = CONNECT_TIMEOUT
    params.blocked_connection_timeout = ANSWER_TIMEOUT
    return params


def blocking_connection(nodes: list[pika.URLParameters]) -> pika.BlockingConnection:
    """``pika.BlockingConnection`` over ``nodes``, each tried in turn. Any failure to
    connect is pika's ``AMQPConnectionError``: its connection workflow raises some outside
    its own ``AMQPError`` family (``CONNECT_FAILURES``: a node that accepts the connection
    and never answers ends in ``AMQPConnectorStackTimeout``), which the callers' handling
    would miss."""
    try:
        return pika.BlockingConnection(nodes)
    except pika.exceptions.AMQPError:
        raise
    except CONNECT_FAILURES as exc:
        raise pika.exceptions.AMQPConnectionError(repr(exc)) from exc


def connection_parameters(url: str | None = None) -> pika.URLParameters:
    """Parameters for the node this process connects to now (see ``node_failed``)."""
    return _bounded(pika.URLParameters(_current_node(broker_nodes(url))))


def every_node_parameters(url: str | None = None) -> list[pika.URLParameters]:
    """Parameters of every node, the current one first: pika's ``BlockingConnection`` takes
    the list and tries each in turn."""
    nodes = broker_nodes(url)
    start = _next_node.get(tuple(nodes), 0) % len(nodes)
    return [_bounded(pika.URLParameters(node)) for node in nodes[start:] + nodes[:start]]
