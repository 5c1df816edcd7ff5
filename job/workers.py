"""When a worker was last heard from, recorded on its claims and heartbeats.

This belongs with the automation module's services (it writes ``workers``); it lives
here, as one conditional UPDATE, until that module offers it.
"""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from automation.models import Worker

# A worker calls the hub every few seconds while it runs; writing its row on every call
# would make each call a write on one hot row. Once in a while is enough for operators.
WORKER_TOUCH_INTERVAL = timedelta(seconds=10)


def worker_touch(*, worker_id: int) -> bool:
    """Set the worker's ``last_seen_at`` unless it was set recently. Returns whether it did.

    A conditional update outside the job's transaction: concurrent calls of one worker
    never wait on each other for longer than this one statement.
    """
    now = timezone.now()
    return bool(
        Worker.objects.filter(pk=worker_id)
        .filter(Q(last_seen_at__isnull=True) | Q(last_seen_at__lt=now - WORKER_TOUCH_INTERVAL))
        .update(last_seen_at=now)
    )
