# A run of webhook.deliver takes many deliveries of its endpoint: the run's deliveries are
# read by its id, and a new delivery joins its endpoint's newest run. Built CONCURRENTLY
# (the deliveries table takes writes from every event of a tenant with endpoints), the new
# endpoint index before the one it replaces is dropped.

from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("webhook", "0005_delivery_verbose_name_plural"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(
                condition=models.Q(("scheduled_run_id__isnull", False), ("status", "pending")),
                fields=["endpoint", "id"],
                name="webhook_deliveries_newest_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="webhookdelivery",
            index=models.Index(
                condition=models.Q(("scheduled_run_id__isnull", False), ("status", "pending")),
                fields=["scheduled_run_id", "id"],
                name="webhook_deliveries_run_idx",
            ),
        ),
        RemoveIndexConcurrently(
            model_name="webhookdelivery",
            name="webhook_deliveries_sched_idx",
        ),
    ]
