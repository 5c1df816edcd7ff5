"""Run bookkeeping in ``task_runs``, by ``run_id``: the worker's memory across receives.

``receive_count`` here is authoritative on both transports (a RabbitMQ message re-sent
from the outbox is a new message to the broker, with its own delivery count).
Each method is one short transaction; none is held while a handler runs.
"""

from __future__ import annotations

import enum
import json
import uuid
from dataclasses import dataclass
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from outbox.models import OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.services import publish
from relay.transports.consume import FailureContext

# Re-arms a message's own outbox row: the relay sends it again once it is due. The row
# may have been purged already (sent more than 7 days ago): then it is written again.
_REARM = """
    INSERT INTO {table} ({tenant_column}run_id, queue, envelope, available_at)
    VALUES ({tenant_value}%(run_id)s, %(queue)s, %(envelope)s::jsonb,
            clock_timestamp() + %(delay)s * interval '1 second')
    ON CONFLICT (run_id) DO UPDATE
       SET sent_at = NULL, available_at = EXCLUDED.available_at
"""


# One statement: the row lock it takes orders concurrent receives of the same run.
_BEGIN = """
    UPDATE task_runs
       SET receive_count = receive_count + 1, status = 'running',
           started_at = coalesce(started_at, clock_timestamp()), finished_at = NULL,
           updated_at = clock_timestamp()
     WHERE run_id = %s AND status NOT IN ('succeeded', 'failed')
 RETURNING receive_count
"""


class Begin(enum.Enum):
    RUN = "run"
    SKIP = "skip"


@dataclass(frozen=True)
class Started:
    decision: Begin
    receive_count: int
    status: str


class RunLedger:
    """``task_runs`` transitions made by the worker."""

    def begin(self, envelope: dict[str, Any]) -> Started:
        """Count this receive and mark the run ``running``, unless it already finished
        (a duplicate delivery: the caller acks and skips it)."""
        run_id = uuid.UUID(str(envelope["run_id"]))
        with transaction.atomic(), connection.cursor() as cursor:
            # Not waiting for this commit to reach the disk halves the cost of a task's
            # bookkeeping. A database crash could lose the mark: the receive goes
            # uncounted (the broker's own limit of 7 still bounds it), nothing else.
            cursor.execute("SET LOCAL synchronous_commit = off")
            cursor.execute(_BEGIN, [run_id])
            row = cursor.fetchone()
            if row is None:
                run = TaskRun.objects.filter(run_id=run_id).first()
                if run is not None:
                    return Started(Begin.SKIP, run.receive_count, run.status)
                # Written by dispatch with the outbox row; a message without one (sent by
                # hand, say) still gets its record.
                TaskRun.objects.bulk_create(
                    [
                        TaskRun(
                            run_id=run_id,
                            task=str(envelope.get("task", "")),
                            queue=str(envelope.get("queue", "default")),
                            event=envelope.get("event") or "",
                            tenant_id=envelope.get("tenant"),
                            correlation_id=envelope.get("correlation_id") or "",
                        )
                    ],
                    ignore_conflicts=True,
                )
                cursor.execute(_BEGIN, [run_id])
                row = cursor.fetchone()
                if row is None:
                    return Started(Begin.SKIP, 0, TaskRun.Status.SUCCEEDED)
        return Started(Begin.RUN, row[0], TaskRun.Status.RUNNING)

    def succeeded(self, run_id: str) -> None:
        TaskRun.objects.filter(run_id=run_id).exclude(status=TaskRun.Status.FAILED).update(
            status=TaskRun.Status.SUCCEEDED,
            finished_at=timezone.now(),
            updated_at=timezone.now(),
        )

    def retrying(
        self,
        envelope: dict[str, Any],
        *,
        error: str,
        delay: float,
        rearm: bool,
    ) -> None:
        """Mark the run ``retrying``; with ``rearm``, also schedule its message again
        through its outbox row, due after ``delay`` (in the same transaction)."""
        run_id = str(envelope["run_id"])
        with transaction.atomic():
            TaskRun.objects.filter(run_id=run_id, status=TaskRun.Status.RUNNING).update(
                status=TaskRun.Status.RETRYING,
                last_error=f"{error} (retry in {delay:.2f} s)",
                updated_at=timezone.now(),
            )
            if rearm:
                rearm_outbox_row(envelope, delay=delay)

    def failed(self, envelope: dict[str, Any], *, failure: FailureContext) -> None:
        """Mark the run ``failed`` and record ``TaskFailed`` in the trail."""
        run_id = str(envelope["run_id"])
        with transaction.atomic():
            TaskRun.objects.filter(run_id=run_id).update(
                status=TaskRun.Status.FAILED,
                last_error=f"{failure.error_type}: {failure.message}",
                finished_at=timezone.now(),
                updated_at=timezone.now(),
            )
            publish(
                "TaskFailed",
                {
                    "run_id": run_id,
                    "task": envelope.get("task"),
                    "queue": envelope.get("queue"),
                    "error_type": failure.error_type,
                    "error_message": failure.message,
                    "receive_count": failure.receive_count,
                },
                tenant=envelope.get("tenant"),
                aggregate=("TaskRun", run_id),
                actor=f"task:{envelope.get('task')}",
            )

    def requeued(self, run_id: str) -> None:
        """A shutdown gave the message back before its task finished."""
        TaskRun.objects.filter(run_id=run_id, status=TaskRun.Status.RUNNING).update(
            status=TaskRun.Status.QUEUED, updated_at=timezone.now()
        )


def rearm_outbox_row(envelope: dict[str, Any], *, delay: float) -> None:
    tenant_id = envelope.get("tenant")
    model = OutboxMessage if tenant_id is not None else PlatformOutboxMessage
    tenant = tenant_id is not None
    sql = _REARM.format(
        table=model._meta.db_table,
        tenant_column="tenant_id, " if tenant else "",
        tenant_value="%(tenant)s, " if tenant else "",
    )
    with connection.cursor() as cursor:
        cursor.execute(
            sql,
            {
                "tenant": tenant_id,
                "run_id": str(envelope["run_id"]),
                "queue": envelope.get("queue", "default"),
                "envelope": json.dumps(envelope),
                "delay": max(0.0, float(delay)),
            },
        )


def requeue_failed_run(run_id: str) -> bool:
    """A dead-lettered message is sent back by an operator: a fresh start for its run."""
    return bool(
        TaskRun.objects.filter(run_id=run_id).update(
            status=TaskRun.Status.QUEUED,
            receive_count=0,
            finished_at=None,
            updated_at=timezone.now(),
        )
    )
