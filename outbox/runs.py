"""Run bookkeeping in ``task_runs``, by ``run_id``: the worker's memory across receives.

``receive_count`` here is authoritative on both transports (a RabbitMQ message re-sent
from the outbox is a new message to the broker, with its own delivery count).
Each method is one short transaction; none is held while a handler runs.

Only one worker runs a run at a time: starting it is an atomic claim that takes a lease
(``lease_holder``, ``lease_expires_at``), which the holder's heartbeat extends. A copy of
the message that finds the run held under a live lease is not run (see docs/worker.md).

A worker claims the runs of the messages it received together (``begin_many``: one
statement for the window) and records the successes of many slots together
(``succeeded_many``: one statement, then the acks). Statements that lock several rows lock
them in ``run_id`` order, so that two workers whose windows share runs (copies of one
message) never deadlock. A success is recorded only by the run's holder while it still
holds it: a handler abandoned past its time limit, or one whose run was taken over after
its lease expired, never overwrites what happened to the run since.
"""

from __future__ import annotations

import enum
import itertools
import os
import re
import socket
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
from django.db import connection, transaction

from broker.consume import FailureContext
from outbox.models import TaskRun
from outbox.rearm import rearm_outbox_row
from outbox.services import publish

# The transitions off the hot path (below) first lock their rows in run_id order
# (``locked``: a materialized CTE, evaluated whole, by key, before the first row changes),
# so that two statements that share runs never deadlock. The status a statement requires
# is checked on the rows ``locked`` holds (as they are now, after any wait for their lock),
# never as a condition on ``task_runs`` itself: there the planner may answer it from
# ``task_runs_unfinished_idx`` and walk every unfinished run of the table (with statistics
# taken before a burst of queued runs, a claim of 64 took 100 ms and grew with the
# backlog). The rows are found by their key, whatever the statistics say.
_LOCKED = """
    WITH locked AS MATERIALIZED (
        SELECT run_id, status, lease_holder, lease_expires_at FROM task_runs
         WHERE run_id = ANY(%(run_ids)s::uuid[])
         ORDER BY run_id FOR UPDATE)
"""

# The worker's window statements (the claim, the beat, the group commit), a few hundred a
# second on a busy worker, keep both promises without that first pass, which cost them
# about 40 % of PostgreSQL's time:
# - Their arrays go sorted by run_id (``_window``), and each row is found from its
#   array's element by key, one after the other (a nested loop over ``unnest``), so the
#   rows are locked in run_id order as they are changed.
# - The status they require is a CASE on the row, which no index answers: the planner
#   can only find the rows by key. A statement that waited for a row's lock checks the
#   CASE again on the row as the other left it (READ COMMITTED): of two claims of one run
#   at the same moment, exactly one wins.
# tests/outbox/test_run_statement_plans.py holds both, with statistics taken before a
# burst.

# The claim of a window of runs, one statement and its own (autocommit) transaction, each
# run with its holder: a run becomes ``running`` under its holder's lease only if nobody
# holds it: it is ``queued`` or ``retrying``, or ``running`` under a lease that expired
# (its holder died or lost touch).
_CLAIM_MANY = """
    UPDATE task_runs AS run
       SET receive_count = run.receive_count + 1, status = 'running',
           started_at = coalesce(run.started_at, clock_timestamp()), finished_at = NULL,
           lease_holder = wanted.holder,
           lease_expires_at = clock_timestamp() + wanted.seconds * interval '1 second',
           updated_at = clock_timestamp()
      FROM unnest(%(run_ids)s::uuid[], %(holders)s::text[], %(seconds)s::float8[])
           AS wanted(run_id, holder, seconds)
     WHERE run.run_id = wanted.run_id
       AND CASE run.status
               WHEN 'queued' THEN true
               WHEN 'retrying' THEN true
               WHEN 'running' THEN run.lease_expires_at IS NULL
                                OR run.lease_expires_at <= clock_timestamp()
               ELSE false
           END
 RETURNING run.run_id::text, run.receive_count
"""

_LOOK_MANY = """
    SELECT run_id::text, status, receive_count,
           extract(epoch FROM lease_expires_at - clock_timestamp())::float8, lease_holder
      FROM task_runs
     WHERE run_id = ANY(%s::uuid[])
"""

# The heartbeat: one statement for every run this process holds.
_EXTEND = """
    UPDATE task_runs AS run
       SET lease_expires_at = clock_timestamp() + held.seconds * interval '1 second'
      FROM unnest(%(run_ids)s::uuid[], %(holders)s::text[], %(seconds)s::float8[])
           AS held(run_id, holder, seconds)
     WHERE run.run_id = held.run_id AND run.lease_holder = held.holder
       AND CASE run.status WHEN 'running' THEN true ELSE false END
 RETURNING run.lease_holder
"""

# The group commit of successes: each by its holder, while it holds the run.
_SUCCEEDED_MANY = """
    UPDATE task_runs AS run
       SET status = 'succeeded', finished_at = clock_timestamp(),
           updated_at = clock_timestamp(), lease_expires_at = NULL
      FROM unnest(%(run_ids)s::uuid[], %(holders)s::text[]) AS done(run_id, holder)
     WHERE run.run_id = done.run_id AND run.lease_holder = done.holder
       AND CASE run.status WHEN 'running' THEN true ELSE false END
 RETURNING run.run_id::text
"""


# The transitions off the hot path, each one statement on rows named by key and guarded on
# the locked rows, as above (a status beside a key is still a status: with the statistics
# of a quiet hour, a single retry walked every running run of a burst).
def _guarded(assignments: str, guard: str) -> str:
    """The runs of ``%(run_ids)s``, locked by key (``_LOCKED``), set with ``assignments``
    where ``guard`` holds on the locked row."""
    return (
        _LOCKED  # noqa: S608 (the module's own constants, joined)
        + "\n    UPDATE task_runs SET "
        + assignments
        + ", updated_at = clock_timestamp()\n     WHERE run_id IN (SELECT run_id FROM locked WHERE "
        + guard
        + ")\n"
    )


# A run its holder still holds -> retrying (after a transient failure), or -> queued (its
# message went back unfinished, free for the next receive).
_HELD = "status = 'running' AND lease_holder = %(holder)s"
_RETRY_LATER = _guarded(
    "status = 'retrying', last_error = %(error)s, lease_expires_at = NULL", _HELD
)
_GIVE_BACK = _guarded("status = 'queued', lease_expires_at = NULL", _HELD)
# An operator's fresh start (a requeue, a dead letter or an outbox row sent again) ->
# queued, its receives counted from zero: never a run that succeeded (its message is a
# duplicate) nor one held under a live lease (it would run twice); with ``failed_only``,
# failed runs alone.
_START_AFRESH = _guarded(
    "status = 'queued', receive_count = 0, finished_at = NULL, lease_holder = '',"
    " lease_expires_at = NULL",
    "status <> 'succeeded'"
    " AND NOT (status = 'running' AND lease_expires_at > clock_timestamp())"
    " AND (status = 'failed' OR NOT %(failed_only)s)",
)


def retry_later(run_id: str, holder: str, *, error: str) -> int:
    """Running under ``holder`` -> retrying: its message comes back after a backoff.
    Returns 1, or 0 when ``holder`` no longer holds it."""
    return _transition(_RETRY_LATER, [run_id], holder=holder, error=error)


def give_back(run_id: str, holder: str) -> int:
    """Running under ``holder`` -> queued: its message went back unfinished."""
    return _transition(_GIVE_BACK, [run_id], holder=holder)


def start_afresh(run_ids: Sequence[Any], *, failed_only: bool = False) -> int:
    """These runs -> queued, their receives counted from zero (see ``_START_AFRESH``);
    returns how many."""
    if not run_ids:
        return 0
    return _transition(_START_AFRESH, [str(run_id) for run_id in run_ids], failed_only=failed_only)


def _transition(sql: str, run_ids: Sequence[str], **params: Any) -> int:
    with connection.cursor() as cursor:
        cursor.execute(sql, {"run_ids": uuid_array(run_ids), **params})
        return cursor.rowcount


# A claim that keeps losing to status changes (released, retried meanwhile) stops trying.
CLAIM_ATTEMPTS = 3


class Begin(enum.Enum):
    RUN = "run"
    SKIP = "skip"
    BUSY = "busy"


@dataclass(frozen=True)
class Started:
    decision: Begin
    receive_count: int
    status: str
    # BUSY: seconds until the holder's lease ends, unless its heartbeat extends it.
    lease_remaining: float = 0.0
    # BUSY: who holds it ("" when not known).
    held_by: str = ""


@dataclass(frozen=True)
class Lease:
    """A run held by this process: extended every ``interval`` seconds by ``seconds``."""

    run_id: str
    holder: str
    seconds: float
    interval: float


def _window(
    run_ids: Sequence[str], holders: Sequence[str], seconds: Sequence[float] | None = None
) -> dict[str, str]:
    """A window statement's arrays, side by side (it unnests them together), sorted by run
    id: the order its rows are locked in (run ids in their canonical form sort as their
    UUIDs do)."""
    order = sorted(range(len(run_ids)), key=run_ids.__getitem__)
    arrays = {
        "run_ids": uuid_array([run_ids[i] for i in order]),
        "holders": text_array([holders[i] for i in order]),
    }
    if seconds is not None:
        arrays["seconds"] = float_array([seconds[i] for i in order])
    return arrays


def _held(leases: Sequence[Lease], seconds: Sequence[float] | None = None) -> dict[str, str]:
    return _window([lease.run_id for lease in leases], [lease.holder for lease in leases], seconds)


# The hot statements' arrays go as one array literal each, cast by the statement
# (``%s::uuid[]``): psycopg's list dumper quotes each element in Python, and wants run ids
# as ``uuid.UUID`` objects first, which together were a fifth of a window's claim and
# commit in the worker's profile. PostgreSQL parses the same literal either way.
_UUID = r"[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}"
_ONE_RUN_ID = re.compile(_UUID)
_RUN_IDS = re.compile(rf"(?:{_UUID},)*{_UUID}")


def canonical_run_id(value: Any) -> str:
    """A run id in the one form the statements compare and return (lowercase, hyphened):
    any form ``uuid.UUID`` reads; ``ValueError`` for what is not a UUID."""
    if isinstance(value, str) and _ONE_RUN_ID.fullmatch(value):
        return value
    return str(uuid.UUID(str(value)))


def uuid_array(run_ids: Sequence[str]) -> str:
    """``{id,id,...}``: the run ids as one ``uuid[]`` literal (each checked)."""
    joined = ",".join(run_ids)
    if joined and not _RUN_IDS.fullmatch(joined):
        joined = ",".join(canonical_run_id(run_id) for run_id in run_ids)
    return "{" + joined + "}"


def text_array(values: Sequence[str]) -> str:
    """``{"a","b",...}``: the strings as one ``text[]`` literal, each quoted."""
    if not values:
        return "{}"
    together = "".join(values)
    if '"' in together or "\\" in together:
        values = [value.replace("\\", "\\\\").replace('"', '\\"') for value in values]
    return '{"' + '","'.join(values) + '"}'


def float_array(values: Sequence[float]) -> str:
    """``{1.0,2.5,...}``: the numbers as one ``float8[]`` literal."""
    return "{" + ",".join([repr(float(value)) for value in values]) + "}"


def new_holder() -> str:
    """Who holds a run: this process (its host, pid and a token of its own, so that a
    process with a recycled pid is another holder), and which of its claims (one per
    delivery, counted)."""
    return f"{_process_prefix()}{next(_claims):x}"


def held_here(holder: str) -> bool:
    """Whether ``holder`` is a claim of this very process."""
    return holder.startswith(_process_prefix())


def _process_prefix() -> str:
    global _prefix, _prefix_pid
    pid = os.getpid()
    if pid != _prefix_pid:
        # First call, or a forked child: a prefix of its own.
        _prefix, _prefix_pid = f"{_HOST}:{pid}:{uuid.uuid4().hex[:8]}.", pid
    return _prefix


_HOST = socket.gethostname()
_prefix, _prefix_pid = "", 0
_claims = itertools.count(1)


@contextmanager
def _prepared_cursor() -> Iterator[psycopg.Cursor]:
    """A cursor for the worker's hot statements (the claim, the beat, the group commit):
    parameters bound by the server and each statement prepared once per connection, not
    quoted into a new text and planned again at each window (Django's cursors bind on the
    client). Autocommit as Django left it; errors are Django's, as from its own cursors."""
    connection.ensure_connection()
    with connection.wrap_database_errors, psycopg.Cursor(connection.connection) as cursor:
        yield _Prepared(cursor)


class _Prepared:
    """``execute`` prepared (``prepare=True``), the rest as the cursor does it."""

    def __init__(self, cursor: psycopg.Cursor) -> None:
        self._cursor = cursor

    def execute(self, sql: str, params: Any = None) -> None:
        self._cursor.execute(sql, params, prepare=True)

    def fetchall(self) -> list[tuple]:
        return self._cursor.fetchall()


class RunLedger:
    """``task_runs`` transitions made by the worker."""

    def begin_many(self, claims: Sequence[tuple[dict[str, Any], str, float]]) -> dict[str, Started]:
        """Claim the runs of a window of messages for their holders (counting this receive,
        marking each ``running`` under its lease), except those that finished (SKIP: a
        duplicate, ack it) or that someone else holds under a live lease (BUSY: give it back
        for later). ``claims`` are (envelope, holder, lease seconds); returns each holder's
        ``Started``. One statement claims every run
        nobody holds (plus one look at the others); two copies of one run in the window:
        the first claims it, the second finds it held (BUSY)."""
        results: dict[str, Started] = {}
        wanted: dict[str, tuple[dict[str, Any], str, float]] = {}
        for envelope, holder, seconds in claims:
            run_id = canonical_run_id(envelope["run_id"])
            if run_id in wanted:
                results[holder] = Started(
                    Begin.BUSY,
                    0,
                    TaskRun.Status.RUNNING,
                    lease_remaining=float(seconds),
                    held_by=wanted[run_id][1],
                )
            else:
                wanted[run_id] = (envelope, holder, float(seconds))
        with _prepared_cursor() as cursor:
            for _ in range(CLAIM_ATTEMPTS):
                if not wanted:
                    break
                run_ids = list(wanted)
                # Autocommit: the claims are committed (durably) before any handler starts.
                cursor.execute(
                    _CLAIM_MANY,
                    _window(
                        run_ids,
                        [wanted[run_id][1] for run_id in run_ids],
                        [wanted[run_id][2] for run_id in run_ids],
                    ),
                )
                for run_id, receive_count in cursor.fetchall():
                    _, holder, _ = wanted.pop(run_id)
                    results[holder] = Started(Begin.RUN, receive_count, TaskRun.Status.RUNNING)
                if not wanted:
                    break
                cursor.execute(_LOOK_MANY, [uuid_array(list(wanted))])
                found = {row[0]: row[1:] for row in cursor.fetchall()}
                for run_id in list(wanted):
                    envelope, holder, _ = wanted[run_id]
                    if run_id not in found:
                        _record_unknown_run(run_id, envelope)
                        continue
                    status, receive_count, remaining, held_by = found[run_id]
                    if status == TaskRun.Status.RUNNING and held_by == holder:
                        # Claimed by an earlier attempt whose answer was lost (a dropped
                        # connection): it is this claim's.
                        results[holder] = Started(Begin.RUN, receive_count, status)
                        del wanted[run_id]
                    elif status in (TaskRun.Status.SUCCEEDED, TaskRun.Status.FAILED):
                        results[holder] = Started(Begin.SKIP, receive_count, status)
                        del wanted[run_id]
                    elif status == TaskRun.Status.RUNNING and (remaining or 0) > 0:
                        results[holder] = Started(
                            Begin.BUSY,
                            receive_count,
                            status,
                            lease_remaining=remaining,
                            held_by=held_by or "",
                        )
                        del wanted[run_id]
                    # Else released or retried between the two statements: claim again.
        for _, holder, _ in wanted.values():
            results[holder] = Started(Begin.BUSY, 0, TaskRun.Status.RUNNING, lease_remaining=1.0)
        return results

    def extend(self, leases: Sequence[Lease], seconds: Sequence[float] | None = None) -> set[str]:
        """Heartbeat: push the leases this process holds forward, each by its ``seconds``
        (or the lease's own); returns the holders whose lease it extended (one lost to
        another worker after it expired, or of a run that finished meanwhile, is left
        alone)."""
        if not leases:
            return set()
        if seconds is None:
            seconds = [lease.seconds for lease in leases]
        with _prepared_cursor() as cursor:
            cursor.execute(_EXTEND, _held(leases, seconds))
            return {holder for (holder,) in cursor.fetchall()}

    def succeeded_many(self, leases: Sequence[Lease]) -> set[str]:
        """The group commit: mark ``succeeded`` every run still held by its lease's
        holder, in one statement; returns the run ids it marked (the others were taken
        over or settled otherwise meanwhile: this success is not theirs to record)."""
        if not leases:
            return set()
        with _prepared_cursor() as cursor:
            cursor.execute(_SUCCEEDED_MANY, _held(leases))
            return {run_id for (run_id,) in cursor.fetchall()}

    def retrying(
        self,
        envelope: dict[str, Any],
        *,
        holder: str,
        error: str,
        delay: float,
        rearm: bool,
    ) -> None:
        """Mark the run ``retrying`` (if ``holder`` still holds it); with ``rearm``, also
        schedule its message again through its outbox row, due after ``delay`` (in the
        same transaction)."""
        run_id = str(envelope["run_id"])
        with transaction.atomic():
            retry_later(run_id, holder, error=f"{error} (retry in {delay:.2f} s)")
            if rearm:
                rearm_outbox_row(envelope, delay=delay)

    def failed(self, envelope: dict[str, Any], *, failure: FailureContext) -> None:
        """Mark the run ``failed`` and record ``TaskFailed`` in the trail."""
        with transaction.atomic():
            run_failed(
                str(envelope["run_id"]),
                task=envelope.get("task"),
                queue=envelope.get("queue"),
                tenant=envelope.get("tenant"),
                error_type=failure.error_type,
                message=failure.message,
                receive_count=failure.receive_count,
                actor=f"task:{envelope.get('task')}",
            )

    def requeued(self, run_id: str, *, holder: str) -> None:
        """A shutdown gave the message back before its task finished: the run is free
        for the next receive at once."""
        give_back(run_id, holder)


def run_failed(
    run_id: str,
    *,
    task: Any,
    queue: Any,
    tenant: Any,
    error_type: str,
    message: str,
    receive_count: int,
    actor: str,
) -> None:
    """Mark the run ``failed`` (whatever it was) and record ``TaskFailed`` in the trail, in
    the caller's transaction: the worker's permanent failure, or the monitor's verdict on a
    run its message will never reach again (``outbox.stranded``)."""
    TaskRun.objects.filter(run_id=run_id).fail(error=f"{error_type}: {message}")
    publish(
        "TaskFailed",
        {
            "run_id": run_id,
            "task": task,
            "queue": queue,
            "error_type": error_type,
            "error_message": message,
            "receive_count": receive_count,
        },
        tenant=tenant,
        aggregate=("TaskRun", run_id),
        actor=actor,
    )


def requeue_failed_run(run_id: str) -> bool:
    """A dead-lettered message is sent back by an operator: a fresh start for its run.

    Not for a run that succeeded (the message is then a duplicate: the worker skips it)
    nor one a worker holds under a live lease (it would run twice); both stay as they are.
    """
    return bool(start_afresh([run_id]))


def _record_unknown_run(run_id: str, envelope: dict[str, Any]) -> None:
    """Written by dispatch with the outbox row; a message without one (sent by hand, say)
    still gets its record, ``queued``, for the claim that follows."""
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
