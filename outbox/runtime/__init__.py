"""The worker runtime: how background tasks are received, run, retried and parked.

- ``registry``: handlers by task name (``@task("maintenance.purge")``);
- ``loop``: the consume loop, slots, heartbeats and shutdown (no database: an
  automation's worker reuses it);
- ``ledger`` and ``processor``: running a task message with its bookkeeping in
  ``task_runs``, retries and dead letters (see docs/worker.md).
"""

from outbox.runtime.errors import PermanentError, is_permanent
from outbox.runtime.registry import TaskMessage, task

__all__ = ["PermanentError", "TaskMessage", "is_permanent", "task"]
