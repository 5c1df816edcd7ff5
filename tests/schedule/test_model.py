"""The schedules as a state machine, driven by Hypothesis over the real database.

Random sequences of what people and schedulers do: creations (up to the tenant's limit and
past it), changes of calendar, pauses and resumes, an automation deactivated, firings at
instants the clock reaches going forwards and backwards (across the clock changes of New
York, Chatham, Lord Howe and Santiago), firings that computed and then crashed before
their commit, two firings whose plans were computed at once, and a plan made stale by a
person's change before it was applied.

After every step: every active, unpaused schedule has a next run; a paused or deactivated
one has its reason and no next run; no due time started two jobs; the tenant holds no more
schedules than its limit. After every committed firing: each due time at most the grace
late when it fired, of a schedule that was running with that calendar, has started exactly
one job, and no schedule started more runs in one firing than the grace has minutes.
"""

from __future__ import annotations

import sys
from collections import Counter
from datetime import datetime, timedelta

import pytest
import time_machine
from django.db import transaction
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from automation.models import Automation
from common.errors import Conflict
from job.models import Job
from schedule.calendar import due_times_between
from schedule.firing import (
    schedules_end_orphaned,
    schedules_fire_due,
    schedules_fire_planned,
    schedules_plan_due,
)
from schedule.models import Schedule, ScheduleRun
from schedule.services import (
    schedule_create,
    schedule_pause,
    schedule_resume,
    schedule_update,
)
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import utc

GRACE = 300
LIMIT = 4
CRONS = [
    "* * * * *",
    "*/7 * * * *",
    "0 * * * *",
    "30 2 * * *",
    "*/15 1-3 * * *",
    "45 2 * * *",
    "5/20 * * * *",
]
ZONES = ["UTC", "America/New_York", "Pacific/Chatham", "Australia/Lord_Howe", "America/Santiago"]
# Just before a clock change: New York's gap and its repeated hour, Chatham's and Lord
# Howe's repeated times, Santiago's missing midnight.
STARTS = [
    utc(2026, 3, 8, 6, 30),
    utc(2026, 11, 1, 5, 20),
    utc(2027, 4, 3, 13, 30),
    utc(2026, 4, 4, 14, 40),
    utc(2026, 9, 6, 3, 40),
]
FORWARD = [1, 30, 61, 150, 299, 301, 20 * 60, 3 * 3600]
BACKWARD = [10, 90, 600]


class _Crash(Exception):
    """A firing that dies after its work and before its commit."""


class Schedules(RuleBasedStateMachine):
    schedules = Bundle("schedules")

    def __init__(self) -> None:
        super().__init__()
        # Each example in a savepoint of the test's transaction, rolled back at its end.
        self._example = transaction.atomic()
        self._example.__enter__()
        try:
            self.tenant = TenantFactory()
            self.automations = [AutomationFactory(), AutomationFactory()]
        except BaseException:
            # No machine, so no teardown: the savepoint is left here, or it would stay open
            # under the test's transaction, and the connection's atomic blocks out of step
            # for every test after this one.
            self._example.__exit__(*sys.exc_info())
            raise
        self.now: datetime = STARTS[0]
        # From when each schedule owes its runs: its creation, its resume, its last change
        # of calendar, and the firings that handled it since (due times before them were
        # started or were missed, for good).
        self.owed_from: dict[int, datetime] = {}

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._example.__exit__(None, None, None)

    def clock(self):
        return time_machine.travel(self.now, tick=False)

    # --- people ----------------------------------------------------------------------------

    @precondition(lambda self: not self.owed_from)
    @rule(start=st.sampled_from(STARTS))
    def begin_at(self, start):
        self.now = start

    @rule(
        target=schedules,
        cron=st.sampled_from(CRONS),
        zone=st.sampled_from(ZONES),
        misfire=st.sampled_from(["run_once", "skip"]),
        which=st.integers(0, 1),
    )
    def create(self, cron, zone, misfire, which):
        held = Schedule.objects.filter(tenant=self.tenant, is_active=True).count()
        with self.clock():
            try:
                schedule = schedule_create(
                    tenant=self.tenant,
                    actor=None,
                    automation_id=self.automations[which].pk,
                    cron=cron,
                    timezone_name=zone,
                    misfire=misfire,
                )
            except Conflict as refusal:
                inactive = not Automation.objects.get(pk=self.automations[which].pk).is_active
                assert refusal.code == (
                    "automation_inactive" if inactive else "schedule_limit_reached"
                )
                assert inactive or held >= LIMIT
                return None
        assert held < LIMIT
        self.owed_from[schedule.pk] = self.now
        return schedule.pk

    @rule(schedule_id=schedules, cron=st.sampled_from(CRONS), zone=st.sampled_from(ZONES))
    def change_calendar(self, schedule_id, cron, zone):
        if schedule_id is None:
            return
        before = Schedule.objects.get(pk=schedule_id)
        with self.clock():
            try:
                schedule_update(
                    tenant=self.tenant,
                    schedule_id=schedule_id,
                    data={"cron": cron, "timezone": zone},
                )
            except Conflict:
                assert not before.is_active
                return
        if (before.cron, before.timezone) != (cron, zone):
            self.owed_from[schedule_id] = self.now

    @rule(schedule_id=schedules)
    def pause(self, schedule_id):
        if schedule_id is None:
            return
        with self.clock():
            try:
                schedule_pause(tenant=self.tenant, schedule_id=schedule_id)
            except Conflict:
                assert not Schedule.objects.get(pk=schedule_id).is_active

    @rule(schedule_id=schedules)
    def resume(self, schedule_id):
        if schedule_id is None:
            return
        before = Schedule.objects.get(pk=schedule_id)
        with self.clock():
            try:
                schedule_resume(tenant=self.tenant, schedule_id=schedule_id)
            except Conflict:
                assert not before.is_active or not before.automation.is_active
                return
        if before.is_paused:
            self.owed_from[schedule_id] = self.now

    @rule(which=st.integers(0, 1))
    def deactivate_automation(self, which):
        Automation.objects.filter(pk=self.automations[which].pk).update(is_active=False)

    # --- the clock -------------------------------------------------------------------------

    @rule(seconds=st.sampled_from(FORWARD))
    def clock_forward(self, seconds):
        self.now += timedelta(seconds=seconds)

    @rule(seconds=st.sampled_from(BACKWARD))
    def clock_back(self, seconds):
        self.now -= timedelta(seconds=seconds)

    # --- schedulers ------------------------------------------------------------------------

    @rule()
    def fire(self):
        running = self._running()
        runs = Counter()
        applied = set()
        for _ in range(20):
            with self.clock():
                firing = schedules_fire_due(now=self.now, batch_size=3)
            applied.update(firing.applied)
            runs.update(Job.objects.get(pk=job).triggered_by["schedule"] for job in firing.started)
            if not firing.more:
                break
        else:
            raise AssertionError("the firing never ran out of due schedules")
        with self.clock():
            schedules_end_orphaned()
        assert max(runs.values(), default=0) <= GRACE // 60 + 2
        self._check_owed(running)
        self._handled(applied)

    @rule()
    def crash_after_computing(self):
        with self.clock():
            schedules_plan_due(now=self.now, batch_size=10)

    @rule()
    def crash_before_commit(self):
        before = ScheduleRun.objects.count()
        plans = schedules_plan_due(now=self.now, batch_size=10)
        with self.clock():
            try:
                with transaction.atomic():
                    schedules_fire_planned(plans, now=self.now)
                    raise _Crash
            except _Crash:
                pass
        assert ScheduleRun.objects.count() == before

    @rule()
    def two_firings_at_once(self):
        running = self._running()
        first = schedules_plan_due(now=self.now, batch_size=10)
        second = schedules_plan_due(now=self.now, batch_size=10)
        with self.clock():
            done = schedules_fire_planned(second, now=self.now)
            late = schedules_fire_planned(first, now=self.now)
        # The one that applied second found every row moved on: its plans were stale.
        assert late.started == [] and late.applied == []
        if len(second) < 10:
            self._check_owed(running)
        self._handled(done.applied)

    @rule(schedule_id=schedules, cron=st.sampled_from(CRONS))
    def change_between_plan_and_commit(self, schedule_id, cron):
        if schedule_id is None:
            return
        plans = schedules_plan_due(now=self.now, batch_size=10)
        before = ScheduleRun.objects.filter(schedule_id=schedule_id).count()
        changed = Schedule.objects.get(pk=schedule_id)
        with self.clock():
            try:
                schedule_update(tenant=self.tenant, schedule_id=schedule_id, data={"cron": cron})
            except Conflict:
                return
            if changed.cron != cron:
                self.owed_from[schedule_id] = self.now
            firing = schedules_fire_planned(plans, now=self.now)
        if changed.cron != cron:
            assert schedule_id not in firing.applied
            assert ScheduleRun.objects.filter(schedule_id=schedule_id).count() == before
        self._handled(firing.applied)

    # --- what must hold ----------------------------------------------------------------------

    def _running(self) -> list[Schedule]:
        """The schedules that run as a firing starts (active, unpaused, live automation)."""
        return list(
            Schedule.objects.filter(
                tenant=self.tenant,
                is_active=True,
                paused_at__isnull=True,
                automation__is_active=True,
            )
        )

    def _handled(self, ids) -> None:
        for schedule_id in ids:
            self.owed_from[schedule_id] = max(self.owed_from[schedule_id], self.now)

    def _check_owed(self, running: list[Schedule]) -> None:
        grace = timedelta(seconds=GRACE)
        started = set(ScheduleRun.objects.values_list("schedule_id", "due_at"))
        for schedule in running:
            since = self.owed_from[schedule.pk]
            owed = due_times_between(
                schedule.cron,
                schedule.timezone,
                # Strictly after: a schedule runs from the first due time after it began.
                since=max(since + timedelta(microseconds=1), self.now - grace),
                until=self.now,
                limit=GRACE // 60 + 2,
            )
            missing = [due for due in owed if (schedule.pk, due) not in started]
            assert not missing, (schedule, self.now, missing)

    @invariant()
    def every_running_schedule_has_a_way_forward(self):
        for schedule in Schedule.objects.filter(tenant=self.tenant):
            if schedule.status == "active":
                assert schedule.next_run_at is not None, schedule
            elif schedule.status == "paused":
                assert schedule.next_run_at is None and schedule.paused_reason
            else:
                assert schedule.next_run_at is None and schedule.deactivated_reason

    @invariant()
    def no_due_time_started_twice(self):
        keys = Counter(
            (job["schedule"], job["due_at"])
            for job in Job.objects.filter(tenant=self.tenant).values_list("triggered_by", flat=True)
        )
        assert max(keys.values(), default=0) <= 1
        assert (
            sum(keys.values()) == ScheduleRun.objects.filter(schedule__tenant=self.tenant).count()
        )

    @invariant()
    def the_tenant_keeps_to_its_limit(self):
        assert Schedule.objects.filter(tenant=self.tenant, is_active=True).count() <= LIMIT


@pytest.mark.django_db
def test_schedules_keep_their_way_forward_and_start_each_due_time_once(settings):
    settings.SCHEDULE_MISFIRE_GRACE_SECONDS = GRACE
    settings.SCHEDULE_MAX_PER_TENANT = LIMIT
    run_state_machine_as_test(
        Schedules,
        settings=hypothesis_settings(
            parent=hypothesis_settings.default, max_examples=200, stateful_step_count=25
        ),
    )
