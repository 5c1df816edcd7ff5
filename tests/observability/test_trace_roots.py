"""Where a job's trace begins when no request of a person began it, and that the hub's own
later work for a job (the monitor's power-on again, a webhook run's deliveries) stays in it.

The SDK's in-memory exporter (``tests.observability.test_tracing.spans``) records the
spans; the envelopes in the outbox are what the other processes would continue from.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import transaction
from django.utils import timezone

from common import tracing
from job.models import Job, JobStatus
from job.monitor import Settlement, job_settle_lost, jobs_resend_power_on
from outbox.models import OutboxMessage, PlatformOutboxMessage
from schedule.firing import schedules_fire_due
from tests.factories import AutomationFactory, JobFactory, RunningJobFactory, TenantFactory
from tests.observability.test_tracing import spans  # noqa: F401
from tests.schedule.support import new_schedule, utc

pytestmark = pytest.mark.django_db

# A trace a person's request began, as a job keeps it.
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE}-00f067aa0ba902b7-01"


def envelopes(task_or_event: str) -> list[dict]:
    rows = [*OutboxMessage.objects.all(), *PlatformOutboxMessage.objects.all()]
    return [
        row.envelope
        for row in rows
        if task_or_event in (row.envelope.get("task"), row.envelope.get("event"))
    ]


def test_each_job_the_scheduler_fires_begins_a_trace_of_its_own(spans):  # noqa: F811
    tenant, automation = TenantFactory(), AutomationFactory()

    with time_machine.travel(utc(2026, 6, 1, 5, 30), tick=False):
        for n in range(3):
            new_schedule(tenant=tenant, automation=automation, name=f"s{n}", params={"n": n})

    firing = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 3))

    assert len(firing.started) == 3
    jobs = list(Job.objects.order_by("pk"))
    traces = [tracing.trace_id_of(job.traceparent) for job in jobs]
    # Each job its own trace, which the machine's claim and report continue from.
    assert all(traces) and len(set(traces)) == 3, [job.traceparent for job in jobs]
    created = envelopes("JobCreated")
    assert created
    for envelope in created:
        job = next(job for job in jobs if job.pk == envelope["payload"]["job_id"])
        assert tracing.trace_id_of(envelope["traceparent"]) == tracing.trace_id_of(job.traceparent)
    roots = {f"{span.context.trace_id:032x}": span for span in spans.get_finished_spans()}
    for trace in traces:
        root = [
            span
            for span in spans.get_finished_spans()
            if f"{span.context.trace_id:032x}" == trace and span.parent is None
        ]
        assert len(root) == 1 and root[0].name == "schedule.fire", roots.get(trace)
        assert root[0].attributes["hubdommed.job_id"] in [job.pk for job in jobs]


def test_a_job_the_monitor_sends_back_to_pending_is_powered_on_again_in_its_trace(spans):  # noqa: F811
    job = RunningJobFactory(traceparent=TRACEPARENT, automation=AutomationFactory(max_attempts=2))
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))

    assert job_settle_lost(job_id=job.pk) is Settlement.REQUEUED

    (power_on,) = envelopes("machines.power_on")
    assert tracing.trace_id_of(power_on.get("traceparent")) == TRACE


def test_the_monitors_power_on_again_for_pending_jobs_is_in_the_oldest_ones_trace(spans):  # noqa: F811
    automation = AutomationFactory()
    JobFactory(automation=automation, traceparent=TRACEPARENT, status=JobStatus.PENDING)
    JobFactory(
        automation=automation,
        traceparent="00-11111111111111111111111111111111-2222222222222222-01",
        status=JobStatus.PENDING,
    )

    jobs_resend_power_on(pending_before=timezone.now() + timedelta(seconds=1))

    (power_on,) = envelopes("machines.power_on")
    assert tracing.trace_id_of(power_on.get("traceparent")) == TRACE


def test_without_tracing_the_monitor_and_the_scheduler_record_no_trace():
    job = RunningJobFactory(traceparent="", automation=AutomationFactory(max_attempts=2))
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(minutes=1))

    with transaction.atomic():
        assert job_settle_lost(job_id=job.pk) is Settlement.REQUEUED

    (power_on,) = envelopes("machines.power_on")
    assert "traceparent" not in power_on
