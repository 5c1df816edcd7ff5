"""The firing: start one job per due time of the schedules whose next run has come.

One batch is two steps. ``schedules_plan_due`` reads the due schedules that no other
firing holds (``SKIP LOCKED``, in a transaction of that one read) and computes, for each,
the due times to start and the next one, the batch's schedules sharing each search (the
calendar's search is bounded, but it is never done under a lock), and checks the
parameters of those that start runs against their automation's schema (a tenant's schema,
up to ``JOB_PARAMS_VALIDATION_SECONDS`` of work: never under a lock either, and bounded by
``ParamsChecks``: parameters found valid are remembered, and a cycle spends at most
``SCHEDULER_PARAMS_CHECK_SECONDS`` on checks, a tenant at most
``SCHEDULER_PARAMS_CHECK_TENANT_SECONDS`` of
it; the schedules left unchecked wait for the next cycle).
``schedules_fire_planned`` then takes the rows with ``FOR UPDATE SKIP LOCKED`` in one short
transaction, keeps only those that still hold what the plan was computed from (same cron,
zone, misfire and next run, the same parameters and schema: a person's edit or another
firing in between makes the plan stale, and the row is left to the next cycle), and
starts the jobs. ``manage.py
run_scheduler`` runs ``schedules_fire_due``, both steps, batch after batch; a firing whose
batch another took meanwhile says more may be due, and its next plan goes past those rows.

The batch is fired as a set: its jobs, their events, task runs and outbox rows, its run
rows and the schedules' new state are written in a few statements for the whole batch
(``job.batch.jobs_create_many``, ``outbox.services.publish_many``, one INSERT of the runs,
one UPDATE of the schedules), not a transaction each, their rows as columns
(``common.columns``). When that fails (a row the database
refuses, a due time another firing took meanwhile), it is rolled back to its savepoint and
the same batch is fired again schedule by schedule, each in a savepoint of its own: the bad
row is isolated, and the others fire.

What starts, for a schedule whose ``next_run_at`` has come:

* every due time from ``next_run_at`` that is at most ``SCHEDULE_MISFIRE_GRACE_SECONDS``
  late starts its job (a scheduler away for a moment loses nothing; at most one per minute
  of the grace);
* of the due times older than that (the hub was down), ``misfire=run_once`` starts the
  latest one, late, when no due time within the grace starts in the same pass (that run
  stands for the ones missed before it); ``skip`` starts none of them.

A schedule whose firing fails for a reason no rule above covers (a bug, a database that
refuses its job) is rolled back alone (in the batch fired again one by one) and moves on
to its next due time, logged and counted (``hubdommed_scheduler_errors_total{cause="bug"}``):
it never stops its batch.

SKIP LOCKED keeps two firings from taking the same schedule at once; the unique key on
(schedule, due time) keeps a due time from starting a second job whatever else happens (a
clock that went back, a schedule moved back by hand).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import IntegrityError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Q
from django.db.models.expressions import RawSQL
from django.utils import timezone

from automation.selectors import automation_params_schemas
from common.columns import insert_sql
from common.errors import DomainError
from common.models import violated_constraint
from job.batch import JobRequest, jobs_create_many, params_refusal
from lifecycle.failures import aborted_by, log_failure
from schedule import calendar
from schedule.models import Misfire, Schedule, ScheduleRun

logger = logging.getLogger("hubdommed.schedule")

RUN_CONSTRAINT = "schedule_runs_schedule_due_at_key"


@dataclass
class Firing:
    """What one batch of the firing did."""

    # Jobs started.
    started: list[int] = field(default_factory=list)
    # Schedules paused or deactivated instead of running.
    stopped: list[int] = field(default_factory=list)
    # Whether the batch was full and moved: more schedules may be due right away.
    more: bool = False
    # Schedules whose plan was applied (the others were held by another firing, or stale).
    applied: list[int] = field(default_factory=list)
    # Schedules planned that another firing held when this one came to lock them (or that
    # stopped running meanwhile): the next plan, which skips the rows held, goes past them.
    held: list[int] = field(default_factory=list)
    # Schedules whose firing failed (a bug): moved on to their next due time.
    failed: list[int] = field(default_factory=list)
    # Schedules due whose parameters the cycle's checks had no time left for
    # (``ParamsChecks``): left as they are, for the next cycle.
    deferred: list[int] = field(default_factory=list)

    def absorb(self, other: Firing) -> None:
        """Add what ``other`` (a firing of some of the same plans) did."""
        for name in ("started", "stopped", "applied", "held", "failed", "deferred"):
            getattr(self, name).extend(getattr(other, name))


@dataclass(frozen=True)
class Plan:
    """What firing one schedule will do, computed without a lock."""

    schedule_id: int
    # What it was computed from (``Schedule.calendar_key``): applied only to a row that
    # still has it.
    key: tuple[str, str, str, datetime | None]
    # The due times to start, in order.
    starts: tuple[datetime, ...] = ()
    # The first due time after now.
    next_run_at: datetime | None = None
    # Why the calendar gave no answer (a bound reached, an unreadable row): it is paused.
    problem: str | None = None
    # What its runs' parameters were checked with, without a lock (``_params_checked``):
    # the schedule's params and its automation's schema as JSON. Applied only to a row
    # that still has them (None: no run starts, nothing was checked).
    params_key: tuple[str, str] | None = None
    # What that check found (None: the parameters are valid).
    params_refusal: DomainError | None = None


# Schedules a batch plans and fires at most: its set's statements stay well within the
# parameters a PostgreSQL statement takes (65,535), and its transaction short.
BATCH_SIZE = 500

# Parameters found valid that a scheduler remembers, a hash each (about 100 bytes).
PARAMS_MEMO_SIZE = 10_000


class ParamsChecks:
    """A scheduler's checks of its schedules' parameters against their schemas.

    Which (schema, parameters) it found valid, as a hash of both written out canonically
    (the last ``PARAMS_MEMO_SIZE``, for the life of the process): an unchanged schedule is
    not checked again every minute. Refusals are not remembered (the schedule is paused;
    a resume checks again), nor is a check cut by the time limit, a refusal too.

    And the time the current cycle spent on checks, in all and per tenant: a check starts
    only while the cycle has spent less than ``SCHEDULER_PARAMS_CHECK_SECONDS`` and its
    tenant less than ``SCHEDULER_PARAMS_CHECK_TENANT_SECONDS``, so one tenant's slow
    parameters cannot hold the others' due runs back, nor many tenants' the cycle. The
    schedules whose check did not start are ``deferred``: no later batch of the cycle
    plans them again, and the next cycle does. ``new_cycle`` starts a cycle; a firing
    without one makes its own."""

    def __init__(self, *, memo_size: int | None = None) -> None:
        self._valid: OrderedDict[bytes, None] = OrderedDict()
        self._memo_size = PARAMS_MEMO_SIZE if memo_size is None else memo_size
        self.new_cycle()

    def new_cycle(self) -> None:
        # A check under way is finished: a cycle may pass these by one check.
        self._seconds = settings.SCHEDULER_PARAMS_CHECK_SECONDS
        self._tenant_seconds = settings.SCHEDULER_PARAMS_CHECK_TENANT_SECONDS
        self._spent = 0.0
        self._spent_by: dict[int, float] = {}
        # Schedules left for the next cycle, in the order they were.
        self.deferred: dict[int, None] = {}

    def __len__(self) -> int:
        return len(self._valid)

    def known_valid(self, digest: bytes) -> bool:
        if digest not in self._valid:
            return False
        self._valid.move_to_end(digest)
        return True

    def spent(self, tenant_id: int) -> float:
        return self._spent_by.get(tenant_id, 0.0)

    def may_check(self, tenant_id: int) -> bool:
        return self._spent < self._seconds and self.spent(tenant_id) < self._tenant_seconds

    def check(
        self, digest: bytes, params: Any, *, schema: Any, automation_id: int, tenant_id: int
    ) -> DomainError | None:
        began = time.monotonic()
        refusal = params_refusal(params, schema=schema, automation_id=automation_id)
        took = time.monotonic() - began
        self._spent += took
        self._spent_by[tenant_id] = self.spent(tenant_id) + took
        if refusal is None:
            self._valid[digest] = None
            self._valid.move_to_end(digest)
            while len(self._valid) > self._memo_size:
                self._valid.popitem(last=False)
        return refusal


def misfire_grace() -> timedelta:
    return timedelta(seconds=settings.SCHEDULE_MISFIRE_GRACE_SECONDS)


def schedules_fire_due(
    *,
    now: datetime | None = None,
    batch_size: int = BATCH_SIZE,
    checks: ParamsChecks | None = None,
) -> Firing:
    """Plan one batch of due schedules, then fire it. ``checks``: the scheduler's, for
    its cycle (without it, this batch is a cycle of its own)."""
    now = now or timezone.now()
    checks = ParamsChecks() if checks is None else checks
    before = len(checks.deferred)
    plans = schedules_plan_due(now=now, batch_size=batch_size, checks=checks)
    deferred = list(checks.deferred)[before:]
    firing = schedules_fire_planned(plans, now=now, checks=checks)
    firing.deferred[:0] = deferred
    # A full batch moved, was taken by another firing meanwhile, or waits for the next
    # cycle's checks: what is due beyond it is next (the next plan skips the rows another
    # firing holds and those deferred, so this never spins on them). A full batch that was
    # all stale (changed by people) waits for the next cycle.
    firing.more = len(plans) + len(deferred) == batch_size and bool(
        firing.applied or firing.held or firing.deferred
    )
    return firing


def next_due_at() -> datetime | None:
    """The earliest due time of any running schedule: the scheduler sleeps until then."""
    return (
        Schedule.objects.filter(next_run_at__isnull=False)
        .order_by("next_run_at")
        .values_list("next_run_at", flat=True)
        .first()
    )


# What a plan reads of a schedule: its calendar, and the parameters its runs are checked with.
PLANNED_FIELDS = (
    "id",
    "cron",
    "timezone",
    "misfire",
    "next_run_at",
    "params",
    "automation",
    "tenant",
)


def schedules_plan_due(
    *, now: datetime, batch_size: int = BATCH_SIZE, checks: ParamsChecks | None = None
) -> list[Plan]:
    """The plans of the earliest due schedules that no other firing holds; nothing is
    locked once the rows are read. A schedule whose parameters ``checks`` has no time left
    for this cycle gets no plan: it is in ``checks.deferred``, and later batches of the
    cycle go past it.

    The schedules of a batch share their searches (``calendar.BatchCalendar``): ten
    thousand schedules of one cron line due at one minute search the calendar once."""
    checks = ParamsChecks() if checks is None else checks
    due = Schedule.objects.select_for_update(skip_locked=True, no_key=True).filter(
        next_run_at__lte=now
    )
    if checks.deferred:
        due = due.exclude(pk__in=RawSQL("SELECT unnest(%s::bigint[])", (list(checks.deferred),)))
    with transaction.atomic():
        # SKIP LOCKED: the rows another firing is writing are left to it, and this one plans
        # the next ones (two schedulers share a burst of due schedules instead of planning
        # the same batch twice). The lock ends with this read: none is held while the
        # calendar is searched.
        rows = list(due.order_by("next_run_at", "id").only(*PLANNED_FIELDS)[:batch_size])
    return schedules_plan(rows, now=now, checks=checks)


def schedules_plan(schedules: list[Schedule], *, now: datetime, checks: ParamsChecks) -> list[Plan]:
    """The plans of firing ``schedules`` (read with ``PLANNED_FIELDS``, no lock held) at
    ``now``, their runs' parameters checked: what ``schedules_fire_planned`` applies. The
    schedules share their calendar's searches; those ``checks`` has no time left for get
    no plan (``checks.deferred``)."""
    searches = calendar.BatchCalendar()
    plans = [plan_of(schedule, now=now, searches=searches) for schedule in schedules]
    return _params_checked(schedules, plans, checks)


def _params_checked(due: list[Schedule], plans: list[Plan], checks: ParamsChecks) -> list[Plan]:
    """The plans, those that start runs with their parameters checked against their
    automation's schema: read and checked here, with no lock held (the same parameters
    with the same schema checked once, and not at all when ``checks`` knows them valid).

    The checks take turns: the tenant that spent least of the cycle's checks goes next,
    one check at a time, while ``checks`` allows it. The plans whose check did not start
    are left out, their schedules added to ``checks.deferred``."""
    starting = [schedule for schedule, plan in zip(due, plans, strict=True) if plan.starts]
    if not starting:
        return plans
    schemas = automation_params_schemas({schedule.automation_id for schedule in starting})
    written = {automation_id: _canonical(schema) for automation_id, schema in schemas.items()}
    keys: dict[int, tuple[tuple[str, str], bytes]] = {}
    verdicts: dict[bytes, DomainError | None] = {}
    # By tenant, in order: each (schema, parameters) to check, and a schedule that has it.
    waiting: dict[int, dict[bytes, Schedule]] = {}
    for schedule in starting:
        key = (_canonical(schedule.params), written.get(schedule.automation_id, "null"))
        digest = hashlib.sha256("\0".join(key).encode()).digest()
        keys[schedule.pk] = (key, digest)
        if checks.known_valid(digest):
            verdicts[digest] = None
        elif digest not in verdicts:
            waiting.setdefault(schedule.tenant_id, {}).setdefault(digest, schedule)
    while waiting:
        tenant_id = min(waiting, key=checks.spent)
        if not checks.may_check(tenant_id):
            del waiting[tenant_id]
            continue
        queue = waiting[tenant_id]
        digest = next(iter(queue))
        schedule = queue.pop(digest)
        if not queue:
            del waiting[tenant_id]
        if digest not in verdicts:  # another tenant's schedule may have the same
            verdicts[digest] = checks.check(
                digest,
                schedule.params,
                schema=schemas.get(schedule.automation_id),
                automation_id=schedule.automation_id,
                tenant_id=tenant_id,
            )
    checked, deferred = [], {}
    for schedule, plan in zip(due, plans, strict=True):
        if not plan.starts:
            checked.append(plan)
            continue
        key, digest = keys[schedule.pk]
        if digest in verdicts:
            checked.append(replace(plan, params_key=key, params_refusal=verdicts[digest]))
        else:
            deferred.setdefault(schedule.tenant_id, []).append(schedule.pk)
            checks.deferred[schedule.pk] = None
    for tenant_id, ids in deferred.items():
        logger.info(
            "tenant %s: the parameters of %d due schedules wait for the next cycle (its "
            "checks took %.2fs of this cycle's): %s",
            tenant_id,
            len(ids),
            checks.spent(tenant_id),
            ids,
        )
    return checked


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def plan_of(
    schedule: Schedule, *, now: datetime, searches: calendar.BatchCalendar | None = None
) -> Plan:
    """What firing ``schedule`` at ``now`` does; every search in it is bounded.

    ``searches`` are the ones the batch shares; without it, this plan makes its own."""
    logger.debug("schedule %s: computing its due times", schedule.pk)
    searches = searches or calendar.BatchCalendar()
    key = schedule.calendar_key()
    since = schedule.next_run_at
    grace = misfire_grace()
    try:
        on_time = searches.due_times_between(
            schedule.cron,
            schedule.timezone,
            since=max(since, now - grace),
            until=now,
            # Due times are whole minutes apart: this many fit in the grace.
            limit=int(grace.total_seconds()) // 60 + 2,
        )
        starts = tuple(on_time)
        if not starts and schedule.misfire == Misfire.RUN_ONCE and since < now - grace:
            latest = searches.latest_due_between(
                schedule.cron,
                schedule.timezone,
                since=since,
                until=now - grace - timedelta(microseconds=1),
            )
            starts = () if latest is None else (latest,)
        elif not starts and since < now - grace:
            logger.info(
                "schedule %s: the runs due since %s were missed; skipped", schedule.pk, since
            )
        next_run_at = searches.next_due_after(schedule.cron, schedule.timezone, now)
    except calendar.UNREADABLE as exc:
        return Plan(schedule.pk, key, problem=f"Its calendar cannot be read: {exc}")
    return Plan(schedule.pk, key, starts=starts, next_run_at=next_run_at)


def schedules_fire_planned(
    plans: list[Plan], *, now: datetime, checks: ParamsChecks | None = None
) -> Firing:
    """Apply ``plans`` in one short transaction: the rows another firing holds are
    skipped, those changed since their plan was computed are left to the next cycle.

    A plan that starts runs and whose parameters were not checked (not made by
    ``schedules_plan``) is checked first, before any lock, with ``checks``: parameters
    are never checked under a schedule's lock.

    A batch that waited past the lock timeout (``DB_LOCK_TIMEOUT``) for a lock another
    session keeps (its commit checks each job's automation row, which a session left in a
    transaction may hold) is fired again one plan a transaction: the others go through,
    the one behind the lock waits for the next cycle, named in the log."""
    checks = ParamsChecks() if checks is None else checks
    before = len(checks.deferred)
    plans = _unchecked_checked(plans, checks)
    firing = _fire_planned(plans, now=now)
    firing.deferred.extend(list(checks.deferred)[before:])
    return firing


def _unchecked_checked(plans: list[Plan], checks: ParamsChecks) -> list[Plan]:
    """``plans``, those that start runs unchecked checked now (their rows read without a
    lock): the others as they are."""
    unchecked = {
        plan.schedule_id: plan for plan in plans if plan.starts and plan.params_key is None
    }
    if not unchecked:
        return plans
    rows = list(
        Schedule.objects.filter(pk__in=list(unchecked)).only(*PLANNED_FIELDS).order_by("id")
    )
    checked = {
        plan.schedule_id: plan
        for plan in _params_checked(rows, [unchecked[row.pk] for row in rows], checks)
    }
    kept = []
    for plan in plans:
        if plan.schedule_id not in unchecked:
            kept.append(plan)
        elif plan.schedule_id in checked:
            kept.append(checked[plan.schedule_id])
        elif plan.schedule_id not in checks.deferred:
            kept.append(plan)  # its row is gone: there is nothing to lock, nothing fires
    return kept


def _fire_planned(plans: list[Plan], *, now: datetime) -> Firing:
    try:
        return _fire_together(plans, now=now)
    except (OperationalError, InterfaceError) as exc:
        if aborted_by(exc) is None or len(plans) < 2:
            raise  # the database went away: the whole cycle is retried
        log_failure(
            logger, exc, "a batch of %d schedules; firing them one a transaction", len(plans)
        )
    firing = Firing()
    for plan in plans:
        try:
            alone = _fire_together([plan], now=now)
        except (OperationalError, InterfaceError) as exc:
            if aborted_by(exc) is None:
                raise
            log_failure(logger, exc, "schedule %s: left for the next cycle", plan.schedule_id)
            firing.held.append(plan.schedule_id)
            continue
        firing.absorb(alone)
    return firing


def _fire_together(plans: list[Plan], *, now: datetime) -> Firing:
    firing = Firing()
    if not plans:
        return firing
    by_id = {plan.schedule_id: plan for plan in plans}
    with transaction.atomic():
        rows = _locked(list(by_id))
        taken = {schedule.pk for schedule in rows}
        firing.held = [schedule_id for schedule_id in by_id if schedule_id not in taken]
        schemas: dict[int, str] = {}
        locked = [
            (schedule, by_id[schedule.pk])
            for schedule in rows
            # Changed since it was planned: the next cycle plans it again.
            if schedule.calendar_key() == by_id[schedule.pk].key
            and _same_params(schedule, by_id[schedule.pk], schemas)
        ]
        if not locked:
            return firing
        try:
            with transaction.atomic():
                _fire_set(locked, now=now, firing=firing)
        except (OperationalError, InterfaceError):
            raise  # the database went away: the whole cycle is retried
        except Exception as exc:
            # One row of the set refused (or a due time taken meanwhile): the set's writes
            # are undone, and the same schedules fire one by one, each alone.
            logger.info(
                "a batch of %d schedules could not fire as one (%s); firing them one by one",
                len(locked),
                exc,
            )
            firing = Firing(held=firing.held)
            fresh = {schedule.pk: schedule for schedule in _locked([s.pk for s, _ in locked])}
            _fire_each([(fresh[s.pk], plan) for s, plan in locked], now=now, firing=firing)
    return firing


def _same_params(schedule: Schedule, plan: Plan, schemas: dict[int, str]) -> bool:
    """Whether the row still has the parameters and schema its plan checked (each
    automation's schema written out once for the batch)."""
    if plan.params_key is None:
        return True  # no run starts: nothing was checked
    automation = schedule.automation
    if automation.pk not in schemas:
        schemas[automation.pk] = _canonical(automation.params_schema)
    return plan.params_key == (_canonical(schedule.params), schemas[automation.pk])


def _requested(schedule: Schedule, plan: Plan, due_at: datetime) -> JobRequest:
    """The job a due time starts, its parameters checked by the plan (never here, under
    the schedule's lock: ``schedules_fire_planned`` checks an unchecked plan first)."""
    if plan.params_key is None:
        raise RuntimeError(
            f"schedule {schedule.pk}: a run whose parameters were not checked before the "
            "schedule was locked"
        )
    return JobRequest(
        tenant_id=schedule.tenant_id,
        automation=schedule.automation,
        params=schedule.params,
        triggered_by=schedule.triggered_by(due_at),
        params_checked=True,
        params_refusal=plan.params_refusal,
    )


def _locked(ids: list[int]) -> list[Schedule]:
    return list(
        Schedule.objects.select_for_update(skip_locked=True, of=("self",))
        # What the firing reads and writes, and each tenant and automation once for the
        # batch (a prefetch), not once per schedule: reading every column of three tables
        # for each schedule was a fifth of a batch's Python time.
        .only(*_FIRED_FIELDS, "cron", "timezone", "misfire", "params", "tenant", "automation")
        .prefetch_related("tenant", "automation")
        # One array, not a parameter an id (quoted one by one).
        .filter(pk__in=RawSQL("SELECT unnest(%s::bigint[])", (ids,)), next_run_at__isnull=False)
        .order_by("next_run_at", "id")
    )


# --- the set: a few statements for the whole batch ----------------------------------------

# The columns the firing changes (``Schedule``'s transitions and ``updated_at``).
_FIRED_FIELDS = (
    "is_active",
    "deactivated_at",
    "deactivated_reason",
    "paused_at",
    "paused_reason",
    "next_run_at",
    "last_run_at",
    "updated_at",
)


def _fire_set(locked: list[tuple[Schedule, Plan]], *, now: datetime, firing: Firing) -> None:
    """Fire every locked schedule of the batch together; raises when one row is refused,
    leaving the caller's savepoint to undo it all."""
    wanted: list[tuple[Schedule, datetime]] = []
    plans = {schedule.pk: plan for schedule, plan in locked}
    for schedule, plan in locked:
        if _stops(schedule, plan, now=now):
            continue
        wanted.extend((schedule, due_at) for due_at in plan.starts)
    taken = _already_started(wanted)
    for schedule, due_at in wanted:
        if (schedule.pk, due_at) in taken:
            logger.info("schedule %s: the run due %s was already started", schedule.pk, due_at)
    wanted = [
        (schedule, due_at) for schedule, due_at in wanted if (schedule.pk, due_at) not in taken
    ]
    outcomes = jobs_create_many(
        [_requested(schedule, plans[schedule.pk], due_at) for schedule, due_at in wanted]
    )
    runs: list[tuple[int, datetime, int]] = []
    for (schedule, due_at), outcome in zip(wanted, outcomes, strict=True):
        if isinstance(outcome, DomainError):
            if not schedule.is_paused:
                reason = _refusal_reason(outcome)
                logger.warning("schedule %s paused: %s", schedule.pk, reason)
                schedule.pause(now=now, reason=reason)
            continue
        runs.append((schedule.pk, due_at, outcome.pk))
        schedule.ran(due_at=due_at)
        firing.started.append(outcome.pk)
    _record_runs(runs, now=now)
    schedules = []
    for schedule, plan in locked:
        if schedule.is_active and not schedule.is_paused:
            schedule.reschedule(next_run_at=plan.next_run_at)
        else:
            firing.stopped.append(schedule.pk)
        schedule.updated_at = now
        schedules.append(schedule)
        firing.applied.append(schedule.pk)
    _save_all(schedules)


def _record_runs(runs: list[tuple[int, datetime, int]], *, now: datetime) -> None:
    """One ``schedule_runs`` row per (schedule, due time, job), in one INSERT."""
    if not runs:
        return
    schedule_ids, due_ats, job_ids = zip(*runs, strict=True)
    sql, params = insert_sql(
        ScheduleRun,
        {"schedule_id": schedule_ids, "due_at": due_ats, "job_id": job_ids},
        same={"created_at": now},
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, params)


def _save_all(schedules: list[Schedule]) -> None:
    """Save the columns the firing changes, for every schedule, in one UPDATE (rows given
    as arrays: ``bulk_update``'s CASE per column and row costs more to build than to run).
    A column the same for every schedule (its new next run, after a burst of one cron line)
    is one value, not an array."""
    ids = [schedule.pk for schedule in schedules]
    sets, arrays, names, params, kinds = [], [ids], ['"id"'], [], ["bigint"]
    for name in _FIRED_FIELDS:
        field = Schedule._meta.get_field(name)
        kind = field.db_type(connection)
        values = [getattr(schedule, field.attname) for schedule in schedules]
        if values.count(values[0]) == len(values):
            sets.append(f'"{field.column}" = %s::{kind}')
            params.append(values[0])
        else:
            sets.append(f'"{field.column}" = v."{field.column}"')
            names.append(f'"{field.column}"')
            arrays.append(values)
            kinds.append(kind)
    unnest = ", ".join(f"%s::{kind}[]" for kind in kinds)
    with connection.cursor() as cursor:
        cursor.execute(
            f'UPDATE "schedules" s SET {", ".join(sets)} '  # noqa: S608 (column names and types of the model, values as parameters)
            f'FROM unnest({unnest}) AS v({", ".join(names)}) WHERE s."id" = v."id"',
            params + arrays,
        )


def _stops(schedule: Schedule, plan: Plan, *, now: datetime) -> bool:
    """End or pause ``schedule`` instead of running it, when it must; True when it did."""
    if not schedule.tenant.is_active:
        schedule.end(now=now, reason="Its tenant was deactivated.")
    elif not schedule.automation.is_active:
        schedule.end(now=now, reason="Its automation was deactivated.")
    elif plan.problem is not None:
        # A row the API would have refused (changed in the database, or a zone the time
        # zone database dropped), or a calendar with no due time left within the bound:
        # paused with the reason, so that it does not fail every cycle.
        logger.error("schedule %s paused: %s", schedule.pk, plan.problem)
        schedule.pause(now=now, reason=plan.problem)
    else:
        return False
    return True


def _already_started(wanted: list[tuple[Schedule, datetime]]) -> set[tuple[int, datetime]]:
    """Of these due times, those that started a job before (a clock that went back, a
    schedule moved back by hand): one read under the schedules' locks, which every firing
    takes before it writes a run. The unique key still stands behind it."""
    if not wanted:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT r.schedule_id, r.due_at FROM schedule_runs r
            JOIN unnest(%s::bigint[], %s::timestamptz[]) AS w(schedule_id, due_at)
              ON r.schedule_id = w.schedule_id AND r.due_at = w.due_at
            """,
            [[schedule.pk for schedule, _ in wanted], [due_at for _, due_at in wanted]],
        )
        return set(cursor.fetchall())


# --- one by one: the batch again when the set was refused --------------------------------


def _fire_each(locked: list[tuple[Schedule, Plan]], *, now: datetime, firing: Firing) -> None:
    for schedule, plan in locked:
        started, stopped = len(firing.started), len(firing.stopped)
        try:
            with transaction.atomic():
                _apply(schedule, plan, now=now, firing=firing)
        except (OperationalError, InterfaceError):
            raise  # the database went away: the whole cycle is retried
        except Exception:
            # A bad row must not stop the batch, nor every later cycle (it would be
            # first in line again): it moves on to its next due time without the runs
            # that failed, logged and counted, and the others carry on. Not paused: a
            # defect of every row (a bad deploy) then heals once fixed.
            logger.exception("schedule %s: its firing failed; moved on", schedule.pk)
            del firing.started[started:], firing.stopped[stopped:]  # rolled back
            _move_on(schedule, plan, now=now)
            firing.failed.append(schedule.pk)
        firing.applied.append(schedule.pk)


def _move_on(schedule: Schedule, plan: Plan, *, now: datetime) -> None:
    schedule.refresh_from_db()  # what the savepoint's rollback left; the lock is still held
    schedule.reschedule(next_run_at=plan.next_run_at)
    schedule.updated_at = now
    schedule.save(update_fields=["next_run_at", "updated_at"])


def _apply(schedule: Schedule, plan: Plan, *, now: datetime, firing: Firing) -> None:
    if not _stops(schedule, plan, now=now):
        for due_at in plan.starts:
            if not _start(schedule, plan, due_at=due_at, now=now, firing=firing):
                break
        schedule.reschedule(next_run_at=plan.next_run_at)
    if not schedule.is_active or schedule.is_paused:
        firing.stopped.append(schedule.pk)
    schedule.updated_at = now
    schedule.save()


def _start(
    schedule: Schedule, plan: Plan, *, due_at: datetime, now: datetime, firing: Firing
) -> bool:
    """Start the run due at ``due_at``; False when the schedule was paused instead."""
    try:
        # A savepoint: a refused job or a due time already taken leaves nothing behind,
        # and the schedule still moves on.
        with transaction.atomic():
            (job,) = jobs_create_many([_requested(schedule, plan, due_at)])
            if isinstance(job, DomainError):
                raise job
            ScheduleRun.objects.create(schedule=schedule, due_at=due_at, job_id=job.pk)
    except IntegrityError as exc:
        if violated_constraint(exc) != RUN_CONSTRAINT:
            raise
        # Another firing already started this due time.
        logger.info("schedule %s: the run due %s was already started", schedule.pk, due_at)
        return True
    except DomainError as refusal:
        reason = _refusal_reason(refusal)
        logger.warning("schedule %s paused: %s", schedule.pk, reason)
        schedule.pause(now=now, reason=reason)
        return False
    schedule.ran(due_at=due_at)
    firing.started.append(job.pk)
    return True


def _refusal_reason(refusal: DomainError) -> str:
    reason = f"The run was refused ({refusal.code}): {refusal.message}"
    problems = refusal.details.get("params") or refusal.details.get("params_schema")
    if problems:
        reason += f" {problems}"
    return reason


# --- schedules whose automation or tenant ended ------------------------------------------


@transaction.atomic
def schedules_end_orphaned() -> list[int]:
    """Deactivate the schedules whose automation or tenant was deactivated.

    The firing refuses them at their next due time anyway; this makes them read as
    stopped at once, whatever their calendar.
    """
    now = timezone.now()
    ended = []
    orphaned = (
        Schedule.objects.select_for_update(skip_locked=True, of=("self",))
        .select_related("tenant", "automation")
        .filter(is_active=True)
        .filter(Q(automation__is_active=False) | Q(tenant__is_active=False))
        .order_by("id")
    )
    for schedule in orphaned:
        reason = (
            "Its tenant was deactivated."
            if not schedule.tenant.is_active
            else "Its automation was deactivated."
        )
        schedule.end(now=now, reason=reason)
        schedule.updated_at = now
        schedule.save()
        ended.append(schedule.pk)
    return ended
