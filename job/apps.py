from django.apps import AppConfig


class JobConfig(AppConfig):
    name = "job"
    default_auto_field = "django.db.models.BigAutoField"
