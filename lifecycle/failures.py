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


# The SQLSTATEs of a transaction the database ended for another's sake, not because it
# is away: deadlock_detected, serialization_failure, and lock_not_available (a lock waited
# for past DB_LOCK_TIMEOUT: another session kept it).
_ABORTS = {"40P01": "deadlock", "40001": "serialization failure", "55P03": "lock timeout"}


def aborted_by(exc: BaseException) -> str | None:
    """What ended ``exc``'s transaction for another's sake ("deadlock", "serialization
    failure", "lock timeout"), or None for any other error (the driver's own error, or
    Django's wrapping of it)."""
    for error in (exc, exc.__cause__):
        found = _ABORTS.get(getattr(error, "sqlstate", None) or "")
        if found is not None:
            return found
    return None


def log_failure(logger: logging.Logger, exc: BaseException, message: str, *args: object) -> None:
    """``message % args``, then ``: aborted by a <deadlock, lock timeout>`` as an error
    (another transaction's doing: a lock order to fix, a session that keeps its locks), or
    ``: database unreachable (reason)`` as a warning, or the traceback of a defect as an
    error."""
    conflict = aborted_by(exc)
    if conflict is not None:
        logger.error(f"{message}: aborted by a %s (%s)", *args, conflict, reason(exc))
    elif isinstance(exc, DATABASE_AWAY):
        logger.warning(f"{message}: database unreachable (%s)", *args, reason(exc))
    else:
        logger.error(message, *args, exc_info=exc)
