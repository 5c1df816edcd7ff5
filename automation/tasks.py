"""Background tasks of the automation module (imported by the worker only)."""

from __future__ import annotations

from datetime import datetime

from automation.machines.services import machine_power_on, machine_restart
from broker import ensure_automation_queue
from common.errors import InvalidInput
from outbox.handlers import TaskMessage, task


def _automation_id(message: TaskMessage) -> int:
    automation_id = message.payload.get("automation_id")
    if not isinstance(automation_id, int) or isinstance(automation_id, bool):
        # No retry can fix a message without its automation: park it.
        raise InvalidInput(f"{message.task}: the payload has no integer automation_id")
    return automation_id


@task("machines.power_on")
def power_on(message: TaskMessage) -> None:
    """Subscribed to JobCreated (and re-sent by the stuck-job monitor)."""
    machine_power_on(automation_id=_automation_id(message))


@task("machines.restart")
def restart(message: TaskMessage) -> None:
    """Dispatched by a credential rotation (restart a running machine), and by the
    stuck-job monitor for a worker silent while jobs wait (``silent_since``)."""
    silent_since = message.payload.get("silent_since")
    if silent_since is not None:
        try:
            silent_since = datetime.fromisoformat(silent_since)
        except (TypeError, ValueError):
            raise InvalidInput(f"{message.task}: silent_since is not a date") from None
    machine_restart(
        automation_id=_automation_id(message),
        only_running=silent_since is None,
        silent_since=silent_since,
    )


@task("automation.provision_queue")
def provision_queue(message: TaskMessage) -> None:
    """Subscribed to AutomationCreated: the automation's own job queue on the broker."""
    ensure_automation_queue(_automation_id(message))
