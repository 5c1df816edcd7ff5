"""What a failed task run means: retried after a backoff, or given up on.

The processor only reports that a handler failed, on which receive and under which policy
(``tasks.json``); this module decides, as Dramatiq leaves it to its retries middleware
rather than to its worker. A run is given up on when the failure is permanent (the
handler said so, or the task is unknown) or when this was its last receive
(``max_receives``); otherwise it comes back after an exponential backoff with jitter.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from outbox.catalog import RetryPolicy, UnknownTask
from outbox.task_errors import is_permanent


@dataclass(frozen=True)
class Decision:
    # True: retry after ``delay`` seconds; False: dead-letter, the run ``failed``.
    retry: bool
    delay: float = 0.0
    # Why it was given up on, for the log line ("permanent error", "receive 5, the last").
    why: str = ""


def backoff_with_jitter(policy: RetryPolicy, receive_count: int) -> float:
    """Exponential backoff with "equal jitter": between half and all of the step, so
    delays still grow from one retry to the next while retries of many messages spread."""
    step = policy.backoff(receive_count)
    return step / 2 + random.uniform(0, step / 2)


def after_failure(exc: Exception, *, receive_count: int, policy: RetryPolicy) -> Decision:
    """What the failure ``exc`` of a run on its ``receive_count``-th receive calls for."""
    if is_permanent(exc) or isinstance(exc, UnknownTask):
        return Decision(retry=False, why="permanent error")
    if receive_count >= policy.max_receives:
        return Decision(retry=False, why=f"receive {receive_count}, the last")
    return Decision(retry=True, delay=backoff_with_jitter(policy, receive_count))
