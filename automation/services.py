"""Use cases of automations and their workers."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from automation.models import Worker

# A worker calls the hub every few seconds while it runs (poll, claim, heartbeat); writing
# its row on every call would turn each call into a write on one hot row. Once a while is
# enough to tell operators it is alive.
WORKER_TOUCH_INTERVAL = timedelta(seconds=10)


def worker_touch(*, worker_id: int) -> bool:
    """Record that the worker was just heard from. Returns whether the row was written.

    A conditional update, so concurrent calls of one worker never wait on each other
    for longer than one statement, and a recent touch is not written again.
    """
    now = timezone.now()
    return bool(
        Worker.objects.filter(pk=worker_id)
        .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now - WORKER_TOUCH_INTERVAL))
        .update(last_seen_at=now)
    )
