from django.apps import AppConfig


class SectorConfig(AppConfig):
    name = "sector"
    default_auto_field = "django.db.models.BigAutoField"
