"""Names and shapes on the broker, the same for the relay and the worker runtime.

A message's ``destination`` (in its envelope) is the queue it belongs to without
the environment's prefix: a queue class (``critical``, ``default``, ``bulk``,
``maintenance``) or an automation's own queue (``automation-<id>``). From it:

- queue name: ``QUEUE_PREFIX + destination``; its dead-letter queue adds ``-dlq``;
- RabbitMQ routing key: ``<destination>.<task>`` (one per message type), and the
  destination's queue binds ``<destination>.#``, so each queue receives exactly the
  messages addressed to it (see docs/messaging.md).
"""

from __future__ import annotations

import re

from django.conf import settings

# The queue classes, in order of priority (the design's table).
QUEUES = ("critical", "default", "bulk", "maintenance")

# Seconds a received message stays invisible to other consumers (SQS), per queue class.
VISIBILITY_TIMEOUT = {"critical": 60, "default": 120, "bulk": 15 * 60, "maintenance": 5 * 60}
# The broker's own redrive: 5 receives of the runtime plus 2 of margin, then the DLQ.
MAX_RECEIVES = 7
# Dead-lettered messages are kept as long as SQS allows, for an operator to look at.
DEAD_LETTER_RETENTION_SECONDS = 14 * 24 * 3600

_AUTOMATION = re.compile(r"automation-[1-9][0-9]*")


class UnknownDestination(ValueError):
    """An envelope names a destination that is neither a queue class nor an automation."""


def automation_queue_name(automation_id: int) -> str:
    """The destination (queue name without prefix) of an automation's own worker."""
    return f"automation-{automation_id}"


def check_destination(destination: str) -> str:
    if destination in QUEUES or _AUTOMATION.fullmatch(destination or ""):
        return destination
    raise UnknownDestination(f"unknown destination {destination!r}")


def queue_class(destination: str) -> str:
    """The class whose settings a destination's queue takes (an automation's queue: critical,
    the class of the jobs its worker is waiting for)."""
    check_destination(destination)
    return destination if destination in QUEUES else "critical"


def queue_name(destination: str) -> str:
    return settings.QUEUE_PREFIX + check_destination(destination)


def dead_letter_queue_name(destination: str) -> str:
    return queue_name(destination) + "-dlq"


def routing_key(destination: str, task: str) -> str:
    return f"{check_destination(destination)}.{task}"


def binding_key(destination: str) -> str:
    return f"{check_destination(destination)}.#"
