"""Failure classes of a task: permanent (no retry can fix it) or transient (everything else)."""

from __future__ import annotations

from broker.consume import BadMessage
from common.errors import Forbidden, InvalidInput, NotFound


class PermanentError(Exception):
    """Raised by a handler for a failure that retrying cannot fix.

    The message goes to its queue's dead-letter queue at once and the run becomes
    ``failed``. Any other exception is transient: the message comes back after a backoff.
    """


class UnknownTaskHandler(PermanentError):
    """The message names a task this worker has no handler for."""


# Domain refusals that no retry changes: bad input, a missing object, a forbidden move.
PERMANENT_ERRORS: tuple[type[BaseException], ...] = (
    PermanentError,
    InvalidInput,
    NotFound,
    Forbidden,
    BadMessage,
)


def is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, PERMANENT_ERRORS)
