"""What an operator may do to the outbox and the task runs (the admin calls these).

- ``outbox_send_again``: rows of either outbox table become due now, sent or not; the
  relay sends them at its next batch (woken after the commit). A row whose run failed
  gives its run a fresh start too, or the worker would skip the copy as settled.
- ``task_run_requeue``: a failed run starts afresh from its outbox row.

Neither touches a run that succeeded or that a worker holds: a copy of such a message is
recognized by the worker (a duplicate, or busy) and not run twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Collection

from django.db import transaction
from django.db.models.functions import Now

from common.errors import Conflict, NotFound
from outbox.models import BaseOutboxMessage, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.runs import start_afresh
from outbox.wake import signal_relay_on_commit

OUTBOX_MODELS: tuple[type[BaseOutboxMessage], ...] = (OutboxMessage, PlatformOutboxMessage)


def _restart_failed_runs(run_ids: Collection[uuid.UUID | str]) -> int:
    return start_afresh(list(run_ids), failed_only=True)


@transaction.atomic
def outbox_send_again(*, model: type[BaseOutboxMessage], ids: Collection[int]) -> int:
    """Make the rows ``ids`` of ``model``'s table due now; returns how many there were."""
    if model not in OUTBOX_MODELS:
        raise TypeError(f"{model.__name__} is not an outbox table")
    rows = list(model.objects.filter(pk__in=list(ids)).values_list("pk", "run_id"))
    if not rows:
        return 0
    # The runs first, then their rows: the order a worker's retry takes them in (the run
    # marked, then its row re-armed), or each would wait for the other.
    _restart_failed_runs([run_id for _, run_id in rows])
    locked = list(
        model.objects.select_for_update()
        .filter(pk__in=[pk for pk, _ in rows])
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    model.objects.filter(pk__in=locked).update(sent_at=None, available_at=Now())
    signal_relay_on_commit()
    return len(locked)


@transaction.atomic
def task_run_requeue(*, run_id: uuid.UUID | str) -> TaskRun:
    """Send a failed run's message again from its outbox row, the run ``queued`` afresh.

    Refused (``Conflict``) for a run that has not failed, and for one whose outbox row is
    gone (sent rows are purged after a while): its dead letter is then the copy to send
    back, from the dead-letter queues.
    """
    run = TaskRun.objects.select_for_update().filter(run_id=run_id).first()
    if run is None:
        raise NotFound("There is no such task run.", code="task_run_not_found")
    if run.status != TaskRun.Status.FAILED:
        raise Conflict(
            "Only a failed run can be requeued.",
            code="task_run_not_failed",
            details={"status": run.status},
        )
    for model in OUTBOX_MODELS:
        row = model.objects.select_for_update().filter(run_id=run.run_id).first()
        if row is not None:
            outbox_send_again(model=model, ids=[row.pk])
            run.refresh_from_db()
            return run
    raise Conflict(
        "The run's message is no longer in the outbox; send back its dead letter instead.",
        code="outbox_row_gone",
    )
