"""What an operator does with the dead-letter queues: look, send back, purge.

``manage.py dead_letters`` and the admin's dead-letter page both stand on these, on
either broker (``settings.BROKER``). A message sent back goes to its queue without its
error context, and its run starts afresh (``queued``, receive count 0); a purged one is
gone for good and its run stays as it ended (``failed``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pika.exceptions
from botocore.exceptions import BotoCoreError, ClientError

from broker import TransportUnavailable, get_dead_letter_box, topology
from broker.consume import DeadLetter, DeadLetterBox
from common.context import log_context
from outbox.runs import requeue_failed_run

logger = logging.getLogger("hubdommed.worker")

# Messages looked at per dead-letter queue when none is said.
DEFAULT_LIMIT = 1000


@dataclass(frozen=True)
class ParkedMessages:
    """One destination's dead-letter queue: how many wait, and the first of them."""

    destination: str
    queue: str
    waiting: int
    letters: list[DeadLetter]


@contextmanager
def _box() -> Iterator[DeadLetterBox]:
    """A dead-letter box of the configured broker; any broker failure is ``TransportUnavailable``
    (a queue that does not exist included: the broker refuses it the same way)."""
    box = None
    try:
        box = get_dead_letter_box()
        yield box
    except (pika.exceptions.AMQPError, BotoCoreError, ClientError, OSError) as exc:
        raise TransportUnavailable(str(exc) or type(exc).__name__) from exc
    finally:
        if box is not None:
            try:
                box.close()
            except (pika.exceptions.AMQPError, BotoCoreError, OSError):
                logger.debug("dead-letter box closed with an error", exc_info=True)


def check_destinations(destinations: Collection[str]) -> None:
    """Raises ``topology.UnknownDestination`` for a name that is neither a queue class nor
    ``automation-<id>``."""
    for destination in destinations:
        topology.check_destination(destination)


def dead_letters_list(
    destinations: Collection[str], *, limit: int = DEFAULT_LIMIT
) -> list[ParkedMessages]:
    """Each destination's dead letters, left where they are (counted before they are
    listed: on SQS, listing hides messages for a while)."""
    check_destinations(destinations)
    parked = []
    with _box() as box:
        for destination in destinations:
            waiting = box.count(destination)
            letters = box.peek(destination, limit)
            parked.append(
                ParkedMessages(
                    destination, topology.dead_letter_queue_name(destination), waiting, letters
                )
            )
    return parked


def _chooser(run_ids: Collection[str] | None) -> Callable[[DeadLetter], bool]:
    if run_ids is None:
        return lambda letter: True
    wanted = set(run_ids)
    return lambda letter: letter.run_id in wanted


def dead_letters_redrive(
    destination: str,
    *,
    run_ids: Collection[str] | None = None,
    limit: int = DEFAULT_LIMIT,
    actor: str = "system",
) -> list[DeadLetter]:
    """Send back to ``destination``'s queue the dead letters of ``run_ids`` (``None``: all
    of them, among the first ``limit``); their runs start afresh. Returns those sent."""
    check_destinations([destination])
    with _box() as box:
        sent = box.requeue(destination, _chooser(run_ids), limit, before_send=_start_afresh)
    for letter in sent:
        with log_context(run_id=letter.run_id):
            logger.info(
                "dead letter sent back",
                extra={"destination": destination, "task": letter.task, "actor": actor},
            )
    return sent


def _start_afresh(letter: DeadLetter) -> None:
    """The run of a message about to be sent back is queued first: a worker receiving the
    message at once finds a run to start, not a failed one whose copy it would skip (and
    acknowledge, the message lost). Should the sending fail, the run waits queued, as a run
    whose message is lost does, for the stuck-job monitor (docs/state-machines.md)."""
    if letter.run_id:
        requeue_failed_run(letter.run_id)


def dead_letters_purge(
    destination: str,
    *,
    run_ids: Collection[str] | None = None,
    limit: int = DEFAULT_LIMIT,
    actor: str = "system",
) -> list[DeadLetter]:
    """Delete for good ``destination``'s dead letters of ``run_ids`` (``None``: all of them,
    among the first ``limit``). Returns those deleted."""
    check_destinations([destination])
    with _box() as box:
        discarded = box.discard(destination, _chooser(run_ids), limit)
    for letter in discarded:
        with log_context(run_id=letter.run_id):
            logger.warning(
                "dead letter purged",
                extra={"destination": destination, "task": letter.task, "actor": actor},
            )
    return discarded
