from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A broken catalog must stop the process at start-up, not at the first publish.
        from outbox.catalog import get_catalog

        get_catalog()

        # Every process of the hub loads this app: its tracing is set up here, before its
        # first request or message (common.tracing; off unless configured).
        from django.conf import settings

        from common import tracing

        tracing.configure(settings)

        from common.ways_forward import register_stranded_check
        from outbox.delivery import TABLES
        from outbox.stranded import StrandedRuns, stranded_rows

        register_stranded_check("task_runs", StrandedRuns())
        for table in TABLES:
            register_stranded_check(table, stranded_rows(table))
