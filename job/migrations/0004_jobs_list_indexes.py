# The list's filters by status and by automation, each in the list's order. Built
# CONCURRENTLY: on a jobs table of millions of rows a plain CREATE INDEX would block every
# new job for as long as it takes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("job", "0003_job_triggered_by"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("tenant"),
                models.F("status"),
                models.OrderBy(models.F("created_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                name="jobs_tenant_status_recent_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                models.F("tenant"),
                models.F("automation"),
                models.OrderBy(models.F("created_at"), descending=True),
                models.OrderBy(models.F("id"), descending=True),
                name="jobs_tenant_auto_recent_idx",
            ),
        ),
    ]
