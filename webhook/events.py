"""The events a tenant's endpoints may be told of.

The catalog (``tasks.json``) lists every event the hub records, its own among them: a
task that failed (``TaskFailed``) carries the hub's internal error (a cloud endpoint's URL,
a library's exception name), a worker or an automation being created is the platform's
business. Only what happens to the tenant's own jobs is the tenant's; the list is written
out here, not derived from the catalog, so that a new event of the hub is not sent to
tenants until someone decides it should be.
"""

from __future__ import annotations

TENANT_EVENT_TYPES: tuple[str, ...] = (
    "JobCreated",
    "JobStarted",
    "JobCompleted",
    "JobFailed",
    "JobCanceled",
)
