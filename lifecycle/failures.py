"""How a daemon logs a failure: a database that is away is expected, a bug is not.

An outage (PostgreSQL restarting, a connection it dropped) is one line with its reason and
no traceback: the daemon carries on and the next attempt reconnects. Anything else is a
defect and keeps its traceback.
"""

from __future__ import annotations

import logging

from django.db import InterfaceError, OperationalError

DATABASE_AWAY = (OperationalError, InterfaceError)


def reason(exc: BaseException) -> str:
    """The first line of what the driver said (its messages run over several lines)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """``message % args``, then either ``: database unreachable (reason)`` as a warning, or
    the traceback of a defect as an error."""
    if isinstance(exc, DATABASE_AWAY):
        logger.warning(f"{message}: database unreachable (%s)", *args, reason(exc))
    else:
        logger.error(message, *args, exc_info=exc)
