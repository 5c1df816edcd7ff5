"""Domain errors: what a use case refuses, with a stable machine code.

Services and aggregates raise these; ``common.api.exception_handler`` turns
them into the one error format. Each has an HTTP status so the mapping lives
with the error, not scattered through views.
"""

from __future__ import annotations

from typing import Any

from lifecycle.failures import aborted_by


class DomainError(Exception):
    """A refused operation. ``code`` is stable and machine-readable."""

    status_code = 400
    code = "invalid"
    default_message = "The request was refused."

    def __init__(
        self,
        message: str | None = None,
        *,
        code: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        self.message = message or self.default_message
        if code is not None:
            self.code = code
        self.details = details or {}
        super().__init__(self.message)


class InvalidInput(DomainError):
    """Input that no retry can fix (validation): a 400 ``invalid``, as any DomainError."""

    default_message = "The input is invalid."


class NotFound(DomainError):
    status_code = 404
    code = "not_found"
    default_message = "Not found."


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"
    default_message = "You are not allowed to do this."


class Conflict(DomainError):
    """The current state forbids the move (an illegal transition, a refused claim)."""

    status_code = 409
    code = "conflict"
    default_message = "The current state does not allow this."

    @classmethod
    def over_field(cls, field: str, message: str, *, code: str) -> Conflict:
        """A value of one input field that another row holds (a taken slug): ``details``
        names the field, as a validation error's would."""
        return cls(message, code=code, details={field: [message]})


class TransactionConflict(Conflict):
    """The database aborted a transaction that ran into another at the same moment (a
    deadlock, a serialization failure): nothing of it was kept, and running it again may
    well go through. A conflict for the caller to retry, not an outage (a 503) nor a bug
    (a 500); a deadlock is still a defect of lock order, and a lock waited for past
    ``DB_LOCK_TIMEOUT`` a transaction that held it too long, so both are logged as errors."""

    code = "concurrent_change"
    default_message = (
        "Another change to the same records ran at the same moment; nothing was changed. Try again."
    )

    def __init__(self, reason: str) -> None:
        super().__init__()
        # What the database said: "deadlock", "serialization failure" or "lock timeout".
        self.reason = reason


def transaction_conflict(exc: BaseException) -> TransactionConflict | None:
    """What to answer for a database error that aborted a transaction because of another
    one, or None for any other error (the driver's own, or Django's wrapping of it)."""
    reason = aborted_by(exc)
    return TransactionConflict(reason) if reason is not None else None
