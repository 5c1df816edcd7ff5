"""The monitor's check of the jobs' state machine: jobs that nothing would move.

Registered by ``JobConfig.ready`` (``common.ways_forward``). What moves each state is
``job.models.WAYS_FORWARD``; the one shape this finds is a job pending while its automation
or tenant has been deactivated for longer than ``MONITOR_PENDING_SECONDS``: no worker will
take it (a deactivated automation's is refused) and no power-on is sent for it, yet
``job.cancel_deactivated`` did not end it (the job was inserted as the deactivation
committed, after the task had looked). It is canceled with the reason, as the task would
have done.

A running job always has a lease (a constraint says so) and the monitor's step 2 settles
it once expired; a pending job of an active automation and tenant is powered on again by
step 1: neither needs this check.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from automation.selectors import automation_ids_deactivated
from common.ways_forward import Repaired
from identity.selectors import tenant_ids_deactivated
from job.selectors import jobs_pending_of
from job.services import job_cancel_deactivated

# Jobs canceled per monitor cycle at most: a cycle does bounded work, the next one goes on.
CHECK_LIMIT = 200


def jobs_stranded() -> list[Repaired]:
    cutoff = timezone.now() - timedelta(seconds=settings.MONITOR_PENDING_SECONDS)
    found = jobs_pending_of(
        automation_ids=automation_ids_deactivated(before=cutoff),
        tenant_ids=tenant_ids_deactivated(before=cutoff),
        pending_before=cutoff,
        limit=CHECK_LIMIT,
    )
    repaired = []
    for job_id in found:
        # SKIP LOCKED: a job someone holds right now is being moved already.
        job = job_cancel_deactivated(job_id=job_id, skip_locked=True, pending_only=True)
        if job is not None:
            repaired.append(
                Repaired(
                    row=f"job {job.pk}",
                    # "pending, and its automation was deactivated: ..."
                    problem=f"pending, and {job.error[:1].lower()}{job.error[1:].rstrip('.')}: "
                    "no worker would ever take it",
                    action="canceled, with the reason in its error (JobCanceled recorded)",
                )
            )
    return repaired
