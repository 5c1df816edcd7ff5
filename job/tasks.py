"""Background tasks of the job module (imported by the worker only)."""

from __future__ import annotations

from common.errors import InvalidInput
from job.services import jobs_cancel_deactivated
from outbox.handlers import TaskMessage, task

# The id each deactivation's event carries.
_SCOPE = {"AutomationDeactivated": "automation_id", "TenantDeactivated": "tenant_id"}


@task("job.cancel_deactivated")
def cancel_deactivated(message: TaskMessage) -> None:
    """Subscribed to AutomationDeactivated and TenantDeactivated: their jobs are ended."""
    key = _SCOPE.get(message.event or "")
    value = message.payload.get(key) if key else None
    if not isinstance(value, int) or isinstance(value, bool):
        # No retry can fix a message that names nothing: park it.
        raise InvalidInput(f"{message.task}: no integer id of a deactivation in {message.event}")
    jobs_cancel_deactivated(**{key: value})
