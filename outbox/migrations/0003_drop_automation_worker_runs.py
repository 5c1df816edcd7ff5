"""Runs written for the messages of automation workers (``worker.job_available``) before
they stopped being written: no one would ever settle them, so they go."""

from django.db import migrations


def drop_unsettleable_runs(apps, schema_editor):
    TaskRun = apps.get_model("outbox", "TaskRun")
    TaskRun.objects.filter(task="worker.job_available", status="queued").delete()


class Migration(migrations.Migration):
    dependencies = [("outbox", "0002_task_run_lease")]

    operations = [migrations.RunPython(drop_unsettleable_runs, migrations.RunPython.noop)]
