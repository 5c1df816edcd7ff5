"""What a re-run records is in its tenant's events list, with whoever asked for it: a
person of the tenant through the API, or a platform admin through the admin's *Run again*;
and nowhere in another tenant's list."""

from __future__ import annotations

import pytest

from job.models import Job
from tests.clients import client_of
from tests.factories import AutomationWithWorkerFactory, JobFactory, ManagerFactory

pytestmark = pytest.mark.django_db

EVENTS = "/api/v1/events"


def finished_job(tenant) -> Job:
    return JobFactory(
        tenant=tenant,
        automation=AutomationWithWorkerFactory(),
        params={"invoice": 7},
        status=Job.Status.SUCCEEDED,
    )


def events_listed(manager, **query) -> list[dict]:
    response = client_of(manager).get(EVENTS, query)
    assert response.status_code == 200, response.json()
    return response.json()["results"]


def test_a_rerun_through_the_api_is_listed_with_the_person_who_asked(user, tenant, other_tenant):
    old = finished_job(tenant)

    new = client_of(user).post(f"/api/v1/jobs/{old.id}/rerun").json()

    (created,) = events_listed(
        ManagerFactory(tenant=tenant), aggregate_type="Job", aggregate_id=str(new["id"])
    )
    assert created["type"] == "JobCreated"
    assert created["actor"] == f"user:{user.id}"
    assert created["tenant"] == tenant.id
    assert created["payload"]["rerun_of"] == old.id
    assert created["payload"]["requested_by"] == user.id
    # Found by who asked, as the list's actor filter promises.
    assert [
        e["id"] for e in events_listed(ManagerFactory(tenant=tenant), actor=f"user:{user.id}")
    ] == [created["id"]]
    assert events_listed(ManagerFactory(tenant=other_tenant)) == []


def test_a_rerun_through_the_admin_is_listed_with_the_platform_admin_who_asked(
    client, platform_admin, tenant
):
    old = finished_job(tenant)
    client.force_login(platform_admin)

    client.post(f"/admin/job/job/{old.pk}/rerun/")

    (new,) = Job.objects.filter(rerun_of=old)
    (created,) = events_listed(
        ManagerFactory(tenant=tenant), aggregate_type="Job", aggregate_id=str(new.pk)
    )
    assert created["type"] == "JobCreated"
    assert created["actor"] == f"user:{platform_admin.id}"
    assert created["payload"]["rerun_of"] == old.id
