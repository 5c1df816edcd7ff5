"""A worker's claim of a job whose tenant was deactivated is refused, and cancels it.

Deactivating a tenant cancels its pending jobs through a task (``job.cancel_deactivated``)
that runs after the deactivation commits, when the broker delivers it; and a job created as
the deactivation committed is left to the monitor's check. Until then the job is pending,
and its worker polls every few seconds: without this refusal it would run the work of a
tenant that no longer exists for the hub.
"""

from __future__ import annotations

import pytest

from identity.services import tenant_deactivate
from job.models import Job
from job.services import DEACTIVATED_TENANT
from outbox.models import Event
from tests.factories import JobFactory, PlatformAdminFactory, TenantFactory
from tests.job.support import events_of

pytestmark = pytest.mark.django_db


def test_the_claim_of_a_deactivated_tenants_job_is_refused_and_cancels_it(worker, worker_api):
    tenant = TenantFactory()
    job = JobFactory(automation=worker.automation, tenant=tenant)
    tenant_deactivate(tenant=tenant, actor=PlatformAdminFactory())

    response = worker_api.post(f"/api/v1/jobs/{job.id}/start")

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "not_pending"
    assert response.json()["error"]["details"] == {"status": "canceled"}
    job.refresh_from_db()
    assert (job.status, job.error) == (Job.Status.CANCELED, DEACTIVATED_TENANT)
    assert job.claim_token is None and job.attempt == 0
    assert events_of(job.id) == ["JobCanceled"]
    assert Event.objects.get(type="JobCanceled").payload["reason"] == DEACTIVATED_TENANT


def test_the_claim_of_an_active_tenants_job_still_succeeds(worker, worker_api):
    job = JobFactory(automation=worker.automation)

    response = worker_api.post(f"/api/v1/jobs/{job.id}/start")

    assert response.status_code == 200, response.content
    assert response.json()["status"] == "running"
