"""The ways-forward check of webhook signing secrets (``common.ways_forward``, machine
``webhook_secrets``).

After a rotation the previous secret keeps signing through its grace; what erases it then
is the ``webhook.expire_secrets`` run the rotation committed with itself, due a second
after the grace. A previous secret still in its row well past its grace had no such run
(kept from before the runs existed, or with no expiry at all) or lost it: nothing else
would ever erase it, so the check does, and the monitor counts it. The margin leaves the
run time to come through a backlog on the maintenance queue.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from common.ways_forward import Repaired
from webhook.services import endpoint_secrets_expire

# How long past its grace a previous secret may wait for its run.
MARGIN = timedelta(hours=1)
# Rows one check repairs at most (the next cycle takes the rest).
BATCH = 100


def secrets_stranded() -> list[Repaired]:
    erased = endpoint_secrets_expire(now=timezone.now() - MARGIN, limit=BATCH)
    return [
        Repaired(
            row=f"webhook endpoint {endpoint_id}",
            problem="its previous signing secret was kept past its grace",
            action="erased",
        )
        for endpoint_id in erased
    ]
