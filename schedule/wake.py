"""The scheduler's wake: it sleeps until the next due time, or until a change wakes it.

A schedule created, given a new calendar or resumed may be due before the time the
scheduler sleeps until: its transaction pushes the wake signal when it commits (the Redis
signal the relay is woken by, ``outbox.wake``, on a key of the scheduler's own), and the
scheduler looks again. Only an accelerator: the scheduler never sleeps longer than its
interval (``SCHEDULER_INTERVAL_SECONDS``), so a lost signal, or Redis away, costs at most
one interval.
"""

from __future__ import annotations

from django.conf import settings

from outbox.wake import signal_key_on_commit


def scheduler_wake_key() -> str:
    return f"{settings.REDIS_KEY_PREFIX}:scheduler:wake"


def wake_scheduler_on_commit() -> None:
    """Wake the sleeping schedulers once the current transaction commits."""
    signal_key_on_commit(scheduler_wake_key())
