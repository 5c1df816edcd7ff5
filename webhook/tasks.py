"""The webhook's background task (imported by the worker only)."""

from __future__ import annotations

import time

from outbox.handlers import TaskMessage, task
from outbox.task_errors import PermanentError
from webhook.delivery import deliveries_run, run_deadline
from webhook.services import endpoint_secrets_expire


@task("webhook.deliver")
def deliver(message: TaskMessage) -> list[str]:
    # A receiver's failure is not this task's: each delivery records it and schedules its
    # own retry. Only the hub's own trouble (the database away) raises, and comes back.
    # The run takes the deliveries scheduled on it, the payload's first, and begins no more
    # once its time limit comes near.
    delivery_id = message.payload.get("delivery_id")
    if not isinstance(delivery_id, int) or isinstance(delivery_id, bool):
        raise PermanentError("the payload names no delivery_id")
    outcomes = deliveries_run(
        delivery_id=delivery_id,
        run_id=message.run_id,
        deadline=run_deadline(time.monotonic()),
    )
    # What each delivery the run took came to (the worker ignores it; tests read it).
    return [str(outcome) for outcome in outcomes]


@task("webhook.expire_secrets")
def expire_secrets(message: TaskMessage) -> None:
    # Due when the grace of the endpoint's rotation ends; a later rotation's grace keeps
    # its own previous secret, and its own run erases it.
    endpoint_id = message.payload.get("endpoint_id")
    if not isinstance(endpoint_id, int) or isinstance(endpoint_id, bool):
        raise PermanentError("the payload names no endpoint_id")
    endpoint_secrets_expire(endpoint_id=endpoint_id)
