# A re-run names the finished job it runs again (POST /jobs/{id}/rerun). As for the list's
# indexes (0004), nothing here blocks new jobs for the length of a pass over a jobs table
# of millions: the column comes with no default (no rewrite), its foreign key is added
# NOT VALID (a moment's lock) and validated apart (a lock that lets inserts through), and
# the index of re-runs is built CONCURRENTLY.

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

FOREIGN_KEY = "jobs_rerun_of_id_57858687_fk_jobs_id"  # the name Django gives it


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("job", "0005_job_traceparent"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AddField(
                    model_name="job",
                    name="rerun_of",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.PROTECT,
                        related_name="+",
                        to="job.job",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    'ALTER TABLE "jobs" ADD COLUMN "rerun_of_id" bigint NULL',
                    'ALTER TABLE "jobs" DROP COLUMN "rerun_of_id"',
                ),
                migrations.RunSQL(
                    f'ALTER TABLE "jobs" ADD CONSTRAINT "{FOREIGN_KEY}" '
                    'FOREIGN KEY ("rerun_of_id") REFERENCES "jobs" ("id") '
                    "DEFERRABLE INITIALLY DEFERRED NOT VALID",
                    migrations.RunSQL.noop,
                ),
                migrations.RunSQL(
                    f'ALTER TABLE "jobs" VALIDATE CONSTRAINT "{FOREIGN_KEY}"',
                    migrations.RunSQL.noop,
                ),
            ],
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("rerun_of__isnull", False)),
                fields=["rerun_of"],
                name="jobs_rerun_of_idx",
            ),
        ),
    ]
