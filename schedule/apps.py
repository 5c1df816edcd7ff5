from django.apps import AppConfig


class ScheduleConfig(AppConfig):
    name = "schedule"
    default_auto_field = "django.db.models.BigAutoField"
