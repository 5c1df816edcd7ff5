"""The webhook's background task (imported by the worker only)."""

from __future__ import annotations

from outbox.handlers import TaskMessage, task
from outbox.task_errors import PermanentError
from webhook.delivery import delivery_attempt
from webhook.services import endpoint_secrets_expire


@task("webhook.deliver")
def deliver(message: TaskMessage) -> None:
    # A receiver's failure is not this task's: the delivery records it and schedules its own
    # retry. Only the hub's own trouble (the database away) raises, and comes back.
    delivery_id = message.payload.get("delivery_id")
    if not isinstance(delivery_id, int) or isinstance(delivery_id, bool):
        raise PermanentError("the payload names no delivery_id")
    delivery_attempt(delivery_id=delivery_id, run_id=message.run_id)


@task("webhook.expire_secrets")
def expire_secrets(message: TaskMessage) -> None:
    # Due when the grace of the endpoint's rotation ends; a later rotation's grace keeps
    # its own previous secret, and its own run erases it.
    endpoint_id = message.payload.get("endpoint_id")
    if not isinstance(endpoint_id, int) or isinstance(endpoint_id, bool):
        raise PermanentError("the payload names no endpoint_id")
    endpoint_secrets_expire(endpoint_id=endpoint_id)
