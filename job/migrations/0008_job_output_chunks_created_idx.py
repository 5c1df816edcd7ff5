# The retention sweep's index on the output chunks' age. Built CONCURRENTLY: the chunks
# table is the biggest of the hub's, and a plain CREATE INDEX would block every running
# job's output for as long as it takes.

from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("job", "0007_job_output_chunks"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="joboutputchunk",
            index=models.Index(fields=["created_at"], name="job_output_chunks_created_idx"),
        ),
    ]
