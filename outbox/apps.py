from django.apps import AppConfig


class OutboxConfig(AppConfig):
    name = "outbox"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A broken catalog must stop the process at start-up, not at the first publish.
        from outbox.catalog import get_catalog

        get_catalog()
