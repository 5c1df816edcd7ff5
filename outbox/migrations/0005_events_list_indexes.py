# The events list's filters (GET /api/v1/events), each in the list's order (id), for a
# tenant and across tenants, and the time index that turns a time range into an id range.
# Built CONCURRENTLY: the trail is never purged, and on a table of millions of rows a plain
# CREATE INDEX would block every event written (every job created, started, finished) for
# as long as it takes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("outbox", "0004_task_run_rearmed_at"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["tenant", "type", "id"], name="events_tenant_type_idx"),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["type", "id"], name="events_type_idx"),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["tenant", "actor", "id"], name="events_tenant_actor_idx"),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["actor", "id"], name="events_actor_idx"),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(
                fields=["tenant", "aggregate_type", "id"], name="events_tenant_agg_type_idx"
            ),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["aggregate_type", "id"], name="events_agg_type_idx"),
        ),
        AddIndexConcurrently(
            model_name="event",
            index=models.Index(fields=["occurred_at", "id"], name="events_occurred_idx"),
        ),
    ]
