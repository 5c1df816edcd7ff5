"""The OpenAPI schema documents the jobs API; the hot queries use their indexes."""

from __future__ import annotations

import pytest
from django.db import connection
from rest_framework.test import APIClient

from job.models import Job
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db


def test_the_schema_documents_every_jobs_endpoint_with_its_authentication():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    paths = schema["paths"]

    people = {
        ("/api/v1/jobs", "get"),
        ("/api/v1/jobs", "post"),
        ("/api/v1/jobs/{job_id}", "get"),
        ("/api/v1/jobs/{job_id}/cancel", "post"),
        ("/api/v1/jobs/{job_id}/rerun", "post"),
    }
    workers = {
        ("/api/v1/worker/jobs", "get"),
        ("/api/v1/jobs/{job_id}/start", "post"),
        ("/api/v1/jobs/{job_id}/heartbeat", "post"),
        ("/api/v1/jobs/{job_id}/complete", "post"),
        ("/api/v1/jobs/{job_id}/fail", "post"),
    }
    for path, method in people | workers:
        assert method in paths.get(path, {}), f"{method.upper()} {path} is not documented"
    for path, method in workers:
        assert paths[path][method]["security"] == [{"workerCredential": []}]
    for path, method in people:
        assert paths[path][method]["security"] == [{"accessToken": []}]
    rerun = paths["/api/v1/jobs/{job_id}/rerun"]["post"]
    assert {"200", "201", "404", "409"} <= set(rerun["responses"])
    assert "Idempotency-Key" in {parameter["name"] for parameter in rerun["parameters"]}
    assert "409" in paths["/api/v1/jobs/{job_id}/start"]["post"]["responses"]
    listing = paths["/api/v1/jobs"]["get"]["responses"]["200"]["content"]["application/json"]
    page = schema["components"]["schemas"][listing["schema"]["$ref"].rsplit("/", 1)[1]]
    assert {"next", "previous", "results"} <= set(page["properties"])  # the cursor page


def test_the_schema_documents_the_output_both_reports_carry():
    schema = APIClient().get("/api/schema/", {"format": "json"}).json()
    components = schema["components"]["schemas"]

    for action in ("complete", "fail"):
        body = schema["paths"][f"/api/v1/jobs/{{job_id}}/{action}"]["post"]["requestBody"]
        ref = body["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
        assert {"claim_token", "output_tail", "exit_code"} <= set(components[ref]["properties"])
    assert {"output_tail", "exit_code", "result", "rerun_of"} <= set(
        components["JobOutput"]["properties"]
    )


def plan_of(queryset) -> str:
    """EXPLAIN of the query with sequential scans and sorts priced out, as on a large table.

    On the test's near-empty table, sorting a few rows from another index costs about the
    same as walking the right one, and the choice then turns on the statistics that the
    tests before left behind. Priced out is not forbidden: without an index that gives the
    order, the plan still sorts.
    """
    sql, params = queryset.query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        cursor.execute(f"EXPLAIN {sql}", params)
        return "\n".join(row[0] for row in cursor.fetchall())


def test_the_poll_reads_only_the_pending_index(worker):
    JobFactory.create_batch(3, automation=worker.automation)
    from job.selectors import jobs_pending_for

    queryset = (
        Job.objects.filter(automation_id=worker.automation_id, status="pending")
        .order_by("created_at", "id")
        .only("id", "automation_id", "created_at")[:20]
    )

    assert "Index Only Scan using jobs_pending_poll_idx" in plan_of(queryset)
    assert len(jobs_pending_for(automation_id=worker.automation_id, limit=20)) == 3


def test_the_claims_running_count_reads_only_the_running_index(worker):
    queryset = Job.objects.filter(automation_id=worker.automation_id, status="running").values(
        "automation_id"
    )

    assert "Index Only Scan using jobs_running_idx" in plan_of(queryset)


def test_the_tenant_listing_walks_the_tenant_index_newest_first(user):
    from job.selectors import job_list

    queryset = job_list(tenant=user.tenant_id)[:50]

    assert "jobs_tenant_recent_idx" in plan_of(queryset)
    assert "Sort" not in plan_of(queryset)


def test_the_monitors_reads_walk_the_partial_indexes():
    from datetime import timedelta

    from django.utils import timezone

    now = timezone.now()
    stale_pending = (
        Job.objects.filter(status="pending", created_at__lt=now, updated_at__lt=now)
        .order_by("automation_id")
        .values_list("automation_id", flat=True)
        .distinct()
    )
    expired = (
        Job.objects.filter(status="running", lease_expires_at__lte=now + timedelta(seconds=1))
        .order_by("lease_expires_at", "id")
        .values_list("id", flat=True)[:1000]
    )
    busy = Job.objects.filter(status="running").order_by().values_list("automation_id").distinct()

    assert "jobs_pending_poll_idx" in plan_of(stale_pending)
    assert "jobs_running_idx" in plan_of(expired)
    assert "jobs_running_idx" in plan_of(busy)


def test_a_jobs_reruns_are_read_from_the_index_of_reruns(user):
    old = JobFactory(tenant=user.tenant, status="failed")
    JobFactory(tenant=user.tenant, rerun_of=old)

    # The admin's link from a job's page to its re-runs.
    queryset = Job.objects.filter(rerun_of=old.pk).order_by("-created_at", "-id")

    assert "jobs_rerun_of_idx" in plan_of(queryset.values("id"))
    assert queryset.count() == 1
