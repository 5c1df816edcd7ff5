from django.apps import AppConfig


class AutomationConfig(AppConfig):
    name = "automation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from automation.selectors import automation_count_active_in_sector
        from sector.usage import register_sector_usage

        # A sector that still classifies an active automation cannot be deactivated.
        register_sector_usage("active_automations", automation_count_active_in_sector)
