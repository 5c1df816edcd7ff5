from django.apps import AppConfig


class WorkerConfig(AppConfig):
    name = "worker"
    default_auto_field = "django.db.models.BigAutoField"
