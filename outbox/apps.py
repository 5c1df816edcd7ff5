from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A broken catalog must stop the process at start-up, not at the first publish.
        from outbox.catalog import get_catalog

        get_catalog()

        from common.ways_forward import register_stranded_check
        from outbox.delivery import TABLES
        from outbox.stranded import StrandedRuns, stranded_rows

        register_stranded_check("task_runs", StrandedRuns())
        for table in TABLES:
            register_stranded_check(table, stranded_rows(table))
