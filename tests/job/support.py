"""Helpers of the jobs tests."""

from __future__ import annotations

from rest_framework.test import APIClient

from outbox.models import Event


def worker_client(worker) -> APIClient:
    """A client that sends the worker's real credential, as a worker does."""
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {worker.credential}")
    return client


def events_of(job_id: int) -> list[str]:
    """The event types recorded for a job, in order."""
    return list(
        Event.objects.filter(aggregate_type="Job", aggregate_id=str(job_id))
        .order_by("id")
        .values_list("type", flat=True)
    )


def heartbeat(worker_api: APIClient, job):
    """The job's worker beats under its current claim."""
    return worker_api.post(
        f"/api/v1/jobs/{job.id}/heartbeat", {"claim_token": str(job.claim_token)}, format="json"
    )
