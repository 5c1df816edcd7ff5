"""A run of webhook.deliver may take the deliveries of many jobs (a failing endpoint's
parked deliveries, taken up together once its probe succeeds): each attempt is still in its
own job's trace, and tells its receiver that trace, not the one of the run's first job."""

from __future__ import annotations

import json

import pytest
from django.db import transaction
from django.utils import timezone

from common import tracing
from outbox.models import OutboxMessage
from outbox.services import publish
from tests.factories import JobFactory, ManagerFactory, TenantFactory
from tests.observability.test_tracing import spans  # noqa: F401
from tests.webhook.conftest import Receiver, Reply, due_deliver_runs, run_attempt
from webhook import transport
from webhook.models import WebhookDelivery
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    settings.WEBHOOK_CONNECT_TIMEOUT = 1.0
    settings.WEBHOOK_READ_TIMEOUT = 0.5
    settings.WEBHOOK_TIMEOUT = 2.0
    settings.WEBHOOK_RETRY_DELAYS = [1.0, 2.0, 4.0]
    transport.pools.close()
    server = Receiver()
    server.thread.start()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()
    transport.pools.close()


def traceparent(n: int) -> str:
    return f"00-{n:032x}-{n:016x}-01"


def run_as_the_worker(row: OutboxMessage) -> None:
    """The run's handler under the span the worker opens for it (``worker.run``)."""
    OutboxMessage.objects.filter(pk=row.pk).update(sent_at=timezone.now())
    with tracing.span("worker.run webhook.deliver", traceparent=row.envelope.get("traceparent")):
        run_attempt(row)


def test_each_delivery_of_a_run_that_takes_many_jobs_is_in_its_own_jobs_trace(
    spans,  # noqa: F811
    receiver,
):
    tenant = TenantFactory()
    endpoint_create(
        tenant=tenant,
        url=receiver.url,
        event_types=["JobCreated"],
        actor=ManagerFactory(tenant=tenant),
    )
    jobs = [JobFactory(tenant=tenant, traceparent=traceparent(n + 1)) for n in range(3)]
    # The first attempt fails: the endpoint is failing, the others are parked behind its
    # probe, and taken up together, in one run, once the probe succeeds. That run's first
    # attempt fails too: its retry is a run of its own, and the last is taken up by it.
    receiver.script(Reply(500), Reply(200), Reply(500))
    for job in jobs:
        with tracing.span("POST /jobs", traceparent=job.traceparent), transaction.atomic():
            publish(
                "JobCreated",
                {"job_id": job.pk, "automation_id": job.automation_id},
                tenant=tenant,
                aggregate=job,
            )

    for _ in range(10):
        rows = due_deliver_runs()
        if not rows:
            break
        for row in rows:
            run_as_the_worker(row)
    runs = [row.envelope for row in OutboxMessage.objects.filter(envelope__task="webhook.deliver")]
    delivered = [r for r in receiver.requests() if r.answered == 200]
    assert len(delivered) == 3, receiver.requests()

    trace_of_job = {job.pk: tracing.trace_id_of(job.traceparent) for job in jobs}
    for request in receiver.requests():
        job_id = json.loads(request.body)["data"]["job_id"]
        assert tracing.trace_id_of(request.headers["traceparent"]) == trace_of_job[job_id]
    attempts = [s for s in spans.get_finished_spans() if s.name == "webhook.deliver POST"]
    assert len(attempts) == len(receiver.requests())
    assert {f"{s.context.trace_id:032x}" for s in attempts} == set(trace_of_job.values())
    # Each run is in the trace of the job whose delivery it begins with.
    for run in runs:
        delivery = WebhookDelivery.objects.get(pk=run["payload"]["delivery_id"])
        job_id = json.loads(delivery.body)["data"]["job_id"]
        assert tracing.trace_id_of(run["traceparent"]) == trace_of_job[job_id], run
