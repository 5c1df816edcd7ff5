"""The dead letters' figure on the admin's front page: how many wait in each queue class's
dead-letter queue, counted without taking any of them (on SQS, looking hides them).

The front page must answer at once, broker or no broker: the count runs in a thread given
``TIMEOUT`` seconds; a broker that does not answer within it, or refuses, makes the figure
"unavailable" with the reason, never an error page nor a wait on the connection's own
timeouts. A thread left behind ends on those (``broker.rabbitmq.connection``).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass

import pika.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from broker import get_dead_letter_box
from broker.topology import QUEUES

TIMEOUT = 2.0


@dataclass(frozen=True)
class DeadLetterCounts:
    # Queue class -> dead letters waiting; empty when unavailable.
    waiting: dict[str, int]
    # Why there are no figures ("" when there are).
    unavailable: str = ""


def dead_letters_waiting(*, timeout: float | None = None) -> DeadLetterCounts:
    """Each queue class's dead letters waiting, within ``timeout`` seconds (``TIMEOUT``)."""
    timeout = TIMEOUT if timeout is None else timeout
    found: dict[str, int] = {}
    failure: list[str] = []

    def count() -> None:
        box = None
        try:
            box = get_dead_letter_box()
            for destination in QUEUES:
                found[destination] = box.count(destination)
        except (pika.exceptions.AMQPError, BotoCoreError, ClientError, OSError) as exc:
            failure.append(str(exc) or type(exc).__name__)
        finally:
            if box is not None:
                with contextlib.suppress(
                    pika.exceptions.AMQPError, BotoCoreError, ClientError, OSError
                ):
                    box.close()

    counter = threading.Thread(target=count, name="console-dead-letters", daemon=True)
    counter.start()
    counter.join(timeout)
    if counter.is_alive():
        return DeadLetterCounts({}, f"the broker did not answer within {timeout:g} s")
    if failure:
        return DeadLetterCounts({}, failure[0])
    return DeadLetterCounts(dict(found))
