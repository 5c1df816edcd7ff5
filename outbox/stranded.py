"""The monitor's checks of the outbox's state machines: runs and rows that nothing would move.

Registered by ``OutboxConfig.ready`` (``common.ways_forward``), run by the stuck-job monitor
each cycle; every statement is here, beside the tables (DESIGN.md: every statement on the
outbox tables lives in ``outbox/``). What moves each state is in ``outbox.models``
(``RUN_WAYS_FORWARD``, ``OUTBOX_ROW_WAY_FORWARD``) and docs/state-machines.md.

**Task runs** (``task_runs``). A run that is not finished waits for its message. Its
message is on its way while its outbox row is unsent (the relay's), while a worker holds
the run under a live lease, and for a while after the row was sent, the lease expired or
the retry came due: the broker delivers it, gives it back, or shows it again after its
delay. ``MONITOR_STRANDED_RUN_SECONDS`` after the latest of these (plus the longest retry
backoff of the catalog for a ``retrying`` run, whose delay SQS may hold), nothing has
claimed the message: the broker lost it (a queue purged, a node lost) or dead-lettered it
without the run being settled (its own redrive after 7 receives, when a worker died on each
of them). The check then:

- fails the run, with the reason in ``last_error`` and ``TaskFailed`` in the trail, when
  it had all its receives (``max_receives`` of its task) or its outbox row is gone (sent
  rows are purged after 7 days): sending it again would restart what the runtime's bound
  stopped, or cannot be done. The reason says where the operators' way forward is: the
  dead-letter queue (``manage.py dead_letters --requeue``) or the admin's *Requeue*;
- otherwise re-arms its outbox row (due now: the relay sends the message again; a worker
  skips a copy of a run that finished) and notes it in ``last_error`` and ``rearmed_at``.
  Once only: a run found stranded again with nothing in between (no worker consumes its
  queue, say) is reported, left to an operator, not sent again and again.

**Outbox rows** (``outbox_messages``, ``platform_outbox_messages``). An unsent row is
moved by ``available_at`` and the relay's sweep. Two shapes have nothing behind them: a row
due later than ``OUTBOX_MAX_DELAY_SECONDS`` (the longest delay ``dispatch`` takes: a clock
gone wrong, a row written by hand) is brought forward, due now; a row the broker keeps
refusing (``REFUSALS_REPORTED`` attempts, backed off now) is kept, and tried again by the
relay every ``RELAY_RETRY_BACKOFF_MAX`` at most (it is the only copy of a committed
change), and reported: an operator must fix what the broker refuses (the refusal is in the
relay's log and the run's ``last_error``).

Each check reads a bounded number of rows per cycle through the partial indexes
(``task_runs_unfinished_idx``, the pending-rows indexes), repairs each row in its own short
transaction under ``SKIP LOCKED`` (a row the relay or a worker holds right now is being
moved already) and checks again, under the lock, that it is still stranded.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from broker.topology import dead_letter_queue_name
from common.ways_forward import Repaired
from outbox.catalog import RetryPolicy, UnknownTask, get_catalog
from outbox.delivery import TABLES
from outbox.models import (
    BaseOutboxMessage,
    OutboxMessage,
    PlatformOutboxMessage,
    TaskRun,
    clock_timestamp,
)
from outbox.runs import run_failed
from outbox.wake import signal_relay_on_commit

# --- task runs -----------------------------------------------------------------------------

# Candidates read per status and cycle, and runs repaired per cycle at most: a cycle does
# bounded work whatever the tables hold; what is left waits for the next cycle.
SCAN_LIMIT = 500
REPAIR_LIMIT = 100

# The oldest candidates first (``task_runs_unfinished_idx`` on (status, updated_at)), after
# where the last cycle's scan of this status stopped; each with whether it is stranded: its
# outbox row (either table, by the unique index on run_id) gone or sent before the cutoff,
# and, when running, its lease expired before it. A run that merely waits, its row unsent
# for a delay (a webhook's retry in 8 hours), is read but not taken; the scan goes past it
# to the next page next cycle, and starts over once at the end.
_CANDIDATES = """
    SELECT run.run_id, run.updated_at,
           coalesce((tenant_row.id IS NULL AND platform_row.id IS NULL)
                    OR coalesce(tenant_row.sent_at, platform_row.sent_at) < %(cutoff)s, false)
           AND (run.status <> 'running'
                OR coalesce(run.lease_expires_at, run.updated_at) < %(cutoff)s)
      FROM (SELECT run_id, status, updated_at, lease_expires_at
              FROM task_runs
             WHERE status = %(status)s AND updated_at < %(updated_before)s
               AND (updated_at, run_id) > (%(after_at)s, %(after_id)s)
             ORDER BY updated_at, run_id
             LIMIT %(scan)s) AS run
      LEFT JOIN outbox_messages AS tenant_row ON tenant_row.run_id = run.run_id
      LEFT JOIN platform_outbox_messages AS platform_row ON platform_row.run_id = run.run_id
     ORDER BY run.updated_at, run.run_id
"""

_START = (datetime(1970, 1, 1, tzinfo=UTC), uuid.UUID(int=0))


class StrandedRuns:
    """The ``task_runs`` check. It keeps, per status, where its scan stopped (the next
    cycle goes on from there), so one instance serves the monitor's whole life."""

    def __init__(self) -> None:
        self._after: dict[str, tuple[datetime, uuid.UUID]] = {}

    def __call__(self) -> list[Repaired]:
        now = timezone.now()
        cutoff = now - timedelta(seconds=settings.MONITOR_STRANDED_RUN_SECONDS)
        found: list[Repaired] = []
        for status, updated_before in (
            (TaskRun.Status.QUEUED, cutoff),
            (TaskRun.Status.RUNNING, cutoff),
            # SQS may hold a retry's message that long before it shows it again.
            (TaskRun.Status.RETRYING, cutoff - timedelta(seconds=_longest_backoff())),
        ):
            for run_id, updated_at in self._scan(status, cutoff, updated_before):
                if len(found) >= REPAIR_LIMIT:
                    return found
                outcome = _repair(run_id, status, updated_at, cutoff=cutoff)
                if outcome is not None:
                    found.append(outcome)
        return found

    def _scan(
        self, status: str, cutoff: datetime, updated_before: datetime
    ) -> list[tuple[uuid.UUID, datetime]]:
        after_at, after_id = self._after.get(status, _START)
        with connection.cursor() as cursor:
            cursor.execute(
                _CANDIDATES,
                {
                    "status": status,
                    "cutoff": cutoff,
                    "updated_before": updated_before,
                    "after_at": after_at,
                    "after_id": after_id,
                    "scan": SCAN_LIMIT,
                },
            )
            rows = cursor.fetchall()
        # A whole page: the next cycle goes on after it; less: the end, start over.
        if len(rows) == SCAN_LIMIT:
            self._after[status] = (rows[-1][1], rows[-1][0])
        else:
            self._after.pop(status, None)
        return [(run_id, updated_at) for run_id, updated_at, stranded in rows if stranded]


def _longest_backoff() -> float:
    tasks = get_catalog().tasks.values()
    return max((spec.retry.backoff_max_seconds for spec in tasks), default=0.0)


def _max_receives(task: str) -> int:
    try:
        return get_catalog().task(task).retry.max_receives
    except UnknownTask:
        return RetryPolicy().max_receives


def _repair(
    run_id: uuid.UUID, status: str, updated_at: datetime, *, cutoff: datetime
) -> Repaired | None:
    """Give one stranded run its way forward, or say why it is left to an operator; None
    when it moved meanwhile or someone holds it right now."""
    with transaction.atomic():
        # Unchanged since the scan (every move of a run writes updated_at), and held by
        # nobody: SKIP LOCKED, the check never waits for a worker or the relay.
        run = (
            TaskRun.objects.select_for_update(skip_locked=True)
            .filter(run_id=run_id, status=status, updated_at=updated_at)
            .first()
        )
        if run is None:
            return None
        if (
            run.status == TaskRun.Status.RUNNING
            and run.lease_expires_at is not None
            and run.lease_expires_at >= cutoff
        ):
            return None  # its lease was extended meanwhile (a heartbeat writes no updated_at)
        model, row = _locked_row(run.run_id)
        if model is not None and row is None:
            return None  # the relay is sending it right now
        if row is not None and (row.sent_at is None or row.sent_at >= cutoff):
            return None  # re-armed or sent again meanwhile
        return _settle(run, row)


def _locked_row(run_id: uuid.UUID) -> tuple[type[BaseOutboxMessage] | None, object | None]:
    """The run's outbox row, locked (``(model, None)``: it exists, and someone holds it;
    ``(None, None)``: there is none)."""
    for model in (OutboxMessage, PlatformOutboxMessage):
        row = model.objects.select_for_update(skip_locked=True).filter(run_id=run_id).first()
        if row is not None:
            return model, row
        if model.objects.filter(run_id=run_id).exists():
            return model, None
    return None, None


def _settle(run: TaskRun, row) -> Repaired:
    label = f"task run {run.run_id} ({run.task})"
    # The last thing that happened to it: its claim or other move, its lease's end, its send.
    since = max(
        moment
        for moment in (run.updated_at, run.lease_expires_at, row.sent_at if row else None)
        if moment is not None
    )
    problem = (
        f"{run.status} since {run.updated_at.isoformat()}, and nothing has claimed its "
        f"message since {since.isoformat()}"
    )
    max_receives = _max_receives(run.task)
    if row is None:
        _fail(
            run,
            "its outbox row is gone (sent rows are purged after 7 days): nothing can send its "
            "message again",
        )
        return Repaired(
            label,
            f"{problem}, and its outbox row is gone",
            "failed (TaskFailed recorded): nothing can send its message again",
        )
    if run.receive_count >= max_receives:
        destination = row.envelope.get("destination") or run.queue
        dead_letters = dead_letter_queue_name(destination)
        _fail(
            run,
            f"received {run.receive_count} times (its task allows {max_receives}) without an "
            f"outcome, and its message has not come back since {since.isoformat()}: the "
            f"broker has most likely dead-lettered it ({dead_letters}; `manage.py "
            f"dead_letters --queue {destination} --requeue {run.run_id}` sends it back), or "
            "lost it (the admin's Requeue sends it again from its outbox row)",
        )
        return Repaired(
            label,
            f"{problem}, after {run.receive_count} receives",
            f"failed (TaskFailed recorded): its message is in {dead_letters} or lost; an "
            "operator sends it back",
        )
    if run.rearmed_at is not None and run.updated_at <= run.rearmed_at:
        return Repaired(
            label,
            f"{run.status}, its message re-sent at {run.rearmed_at.isoformat()} and claimed by "
            "nobody since",
            f"left as it is: does a worker consume the {run.queue} queue (QUEUES)? The "
            "admin's Send again on its outbox row sends it once more",
            repaired=False,
        )
    _rearm(run, row)
    return Repaired(
        label,
        problem,
        "its outbox row re-armed, due now: the relay sends the message again (a copy of a "
        "run that finished is skipped by the worker)",
    )


def _fail(run: TaskRun, reason: str) -> None:
    run_failed(
        str(run.run_id),
        task=run.task,
        queue=run.queue,
        tenant=run.tenant_id,
        error_type="Stranded",
        message=reason,
        receive_count=run.receive_count,
        actor="system",
    )


def _rearm(run: TaskRun, row) -> None:
    now = timezone.now()
    note = (
        f"Stranded: nothing claimed its message for {settings.MONITOR_STRANDED_RUN_SECONDS} s; "
        f"re-sent by the monitor at {now.isoformat()}"
    )
    # Due by the database's clock, the one the relay compares with.
    type(row).objects.filter(pk=row.pk).update(sent_at=None, available_at=clock_timestamp())
    fields = {
        "rearmed_at": now,
        "updated_at": now,
        "last_error": f"{note} (before: {run.last_error})" if run.last_error else note,
    }
    if run.status == TaskRun.Status.RUNNING:
        # Its holder is long gone: the run waits for its message again, held by nobody.
        fields.update(status=TaskRun.Status.QUEUED, lease_holder="", lease_expires_at=None)
    TaskRun.objects.filter(pk=run.pk).update(**fields)
    signal_relay_on_commit()


# --- outbox rows ---------------------------------------------------------------------------

# Refusals after which a row the broker keeps refusing is reported (with the default
# backoff, about a quarter of an hour of them).
REFUSALS_REPORTED = 10
ROW_LIMIT = 100

# The pending-rows index (outbox_messages_pending_idx, platform_outbox_pending_idx) holds
# available_at: only rows backed off or delayed now are read further.
_STRANDED_ROWS = """
    SELECT id, run_id, envelope->>'task', available_at, attempts, created_at,
           available_at > clock_timestamp() + %(max_delay)s * interval '1 second'
      FROM {table}
     WHERE sent_at IS NULL AND available_at > clock_timestamp()
       AND (available_at > clock_timestamp() + %(max_delay)s * interval '1 second'
            OR attempts >= %(refusals)s)
     ORDER BY id
     LIMIT %(limit)s
"""
_BRING_FORWARD = """
    UPDATE {table} SET available_at = clock_timestamp()
     WHERE id IN (SELECT id FROM {table}
                   WHERE id = %(id)s AND sent_at IS NULL
                     AND available_at > clock_timestamp() + %(max_delay)s * interval '1 second'
                     FOR UPDATE SKIP LOCKED)
"""


def stranded_rows(table: str):
    """The check of one outbox table (registered once per table)."""
    if table not in TABLES:
        raise ValueError(f"not an outbox table: {table!r}")

    def check() -> list[Repaired]:
        params = {
            "max_delay": settings.OUTBOX_MAX_DELAY_SECONDS,
            "refusals": REFUSALS_REPORTED,
            "limit": ROW_LIMIT,
        }
        with connection.cursor() as cursor:
            cursor.execute(_STRANDED_ROWS.format(table=table), params)
            rows = cursor.fetchall()
        found = []
        for row_id, run_id, task, available_at, attempts, created_at, too_late in rows:
            label = f"{table} row {row_id} ({task} run {run_id})"
            if too_late:
                if _bring_forward(table, row_id):
                    found.append(
                        Repaired(
                            label,
                            f"unsent and due only at {available_at.isoformat()}, past the "
                            f"longest delay the hub makes ({settings.OUTBOX_MAX_DELAY_SECONDS} s)",
                            "due now: the relay sends it at its next sweep",
                        )
                    )
                continue
            found.append(
                Repaired(
                    label,
                    f"unsent since {created_at.isoformat()}: the broker keeps refusing it",
                    f"left to the relay, which tries it again every "
                    f"{settings.RELAY_RETRY_BACKOFF_MAX:g} s at most ({attempts} attempts so "
                    f"far){_refusal(run_id)}: fix what the broker refuses (an undeclared "
                    "queue: manage.py setup_broker; a size limit)",
                    repaired=False,
                )
            )
        return found

    return check


def _bring_forward(table: str, row_id: int) -> bool:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            _BRING_FORWARD.format(table=table),
            {"id": row_id, "max_delay": settings.OUTBOX_MAX_DELAY_SECONDS},
        )
        moved = cursor.rowcount == 1
        if moved:
            signal_relay_on_commit()
    return moved


def _refusal(run_id: uuid.UUID) -> str:
    """The broker's last refusal, as the relay noted it on the run (none for a message to
    an automation's own worker, which has no run)."""
    error = TaskRun.objects.filter(run_id=run_id).values_list("last_error", flat=True).first()
    return f"; last refusal: {error}" if error else ""
