"""The scheduler's parameter checks are bounded: a tenant whose parameters are slow to check
against its schema (up to ``JOB_PARAMS_VALIDATION_SECONDS`` each) does not stall the cycle
for every tenant. Each cycle spends at most ``SCHEDULER_PARAMS_CHECK_SECONDS`` on checks, a
tenant at most ``SCHEDULER_PARAMS_CHECK_TENANT_SECONDS`` of it, the tenants that spent least
going first; the
schedules left unchecked wait for the next cycle. Parameters found valid are remembered
(their schema and parameters' hash), so an unchanged schedule is not checked every minute."""

from __future__ import annotations

import time

import pytest
import time_machine
from django.utils import timezone

from job import services as job_services
from schedule import firing as schedule_firing
from schedule.firing import schedules_fire_due
from schedule.management.commands.run_scheduler import Command
from schedule.models import Schedule
from tests.factories import AutomationFactory, TenantFactory
from tests.schedule.support import jobs_of, new_schedule, utc

# What one check of a "slow" schedule's parameters takes.
SLOW = 0.25


@pytest.fixture
def checks(monkeypatch):
    """Every parameter check, in order (its params); those with a "slow" key take SLOW."""
    made: list[dict] = []
    check = job_services.params_errors

    def counted(params, schema):
        made.append(params)
        if "slow" in params:
            time.sleep(SLOW)
        return check(params, schema)

    monkeypatch.setattr(job_services, "params_errors", counted)
    return made


def _due_now(*schedules: Schedule) -> None:
    Schedule.objects.filter(pk__in=[s.pk for s in schedules]).update(
        next_run_at=timezone.now().replace(second=0, microsecond=0)
    )


@pytest.mark.django_db(transaction=True)
def test_a_tenant_slow_to_check_does_not_hold_back_the_others(checks, monkeypatch, settings):
    settings.SCHEDULER_PARAMS_CHECK_SECONDS = 1.0
    settings.SCHEDULER_PARAMS_CHECK_TENANT_SECONDS = 0.5
    slow_tenant, other_tenant = TenantFactory(), TenantFactory()
    open_schema = {"type": "object"}
    # First in line: the slow tenant's twelve schedules (due first, lower ids).
    slow = [
        new_schedule(
            tenant=slow_tenant,
            automation=AutomationFactory(params_schema=open_schema),
            name=f"slow {n}",
            cron="* * * * *",
            params={"slow": n},
        )
        for n in range(12)
    ]
    other = new_schedule(
        tenant=other_tenant,
        automation=AutomationFactory(params_schema=open_schema),
        cron="* * * * *",
        params={"fast": 1},
    )
    _due_now(*slow, other)
    checks.clear()
    command = Command()

    def slow_checks_of_a_cycle() -> int:
        before = len(checks)
        command.run_cycle()
        return sum(1 for params in checks[before:] if "slow" in params)

    # The slow tenant's checks would take 3 s: the first cycle made the few its 0.5 s
    # allow (a check under way is finished), and the other tenant's run started in it.
    # Counted, not timed: a check takes SLOW or more, so the count bounds the time.
    assert 1 <= slow_checks_of_a_cycle() <= 3
    assert jobs_of(other)
    started = [schedule for schedule in slow if jobs_of(schedule)]
    assert 1 <= len(started) <= 3
    # The rest wait, still due, for the next cycles: each checks some more of them.
    for _ in range(12):
        if all(jobs_of(schedule) for schedule in slow):
            break
        assert slow_checks_of_a_cycle() <= 3
    assert all(jobs_of(schedule) for schedule in slow)
    # Each parameter was checked once: none again for a later batch or cycle.
    assert sorted(params.get("slow", -1) for params in checks) == [-1, *range(12)]


@pytest.mark.django_db
def test_unchanged_parameters_are_checked_once_across_cycles(checks, tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="* * * * *")
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=utc(2026, 6, 1, 6, 0))
    checks.clear()
    memo = schedule_firing.ParamsChecks()

    for minute in range(3):
        memo.new_cycle()
        firing = schedules_fire_due(now=utc(2026, 6, 1, 6, minute, 3), checks=memo)
        assert len(firing.started) == 1

    assert checks == [{"name": "Ada"}]
    # Changed parameters, or a changed schema, are checked again.
    Schedule.objects.filter(pk=schedule.pk).update(params={"name": "Grace"})
    memo.new_cycle()
    assert len(schedules_fire_due(now=utc(2026, 6, 1, 6, 3, 3), checks=memo).started) == 1
    automation.params_schema = {**automation.params_schema, "title": "renamed"}
    automation.save()
    memo.new_cycle()
    assert len(schedules_fire_due(now=utc(2026, 6, 1, 6, 4, 3), checks=memo).started) == 1
    assert checks == [{"name": "Ada"}, {"name": "Grace"}, {"name": "Grace"}]


@pytest.mark.django_db
def test_the_memo_keeps_its_bound(tenant, automation, monkeypatch):
    memo = schedule_firing.ParamsChecks(memo_size=2)
    schedules = []
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        for n in range(4):
            schedules.append(
                new_schedule(
                    tenant=tenant, automation=automation, name=f"s{n}", params={"name": f"{n}"}
                )
            )

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3), checks=memo)

    assert len(firing.started) == 4
    assert len(memo) == 2


@pytest.mark.django_db
def test_parameters_that_cannot_be_checked_in_time_pause_the_schedule(
    tenant, settings, monkeypatch
):
    """A check cut by ``JOB_PARAMS_VALIDATION_SECONDS`` (a pattern that backtracks on these
    parameters) pauses the schedule with the reason, and is not remembered."""
    settings.JOB_PARAMS_VALIDATION_SECONDS = 0.05
    automation = AutomationFactory(
        params_schema={"type": "object", "patternProperties": {"^([a-z]+)+$": {}}}
    )
    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, params={"a": 1})
    # Written past the API, which would refuse them for the same reason.
    Schedule.objects.filter(pk=schedule.pk).update(params={"a" * 5000 + "!": 1})
    memo = schedule_firing.ParamsChecks()

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3), checks=memo)

    assert firing.stopped == [schedule.pk] and not firing.started
    schedule.refresh_from_db()
    assert schedule.is_paused
    assert "took too long" in schedule.paused_reason
    assert len(memo) == 0
