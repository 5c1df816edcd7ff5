from django.apps import AppConfig


class IdentityConfig(AppConfig):
    name = "identity"
    default_auto_field = "django.db.models.BigAutoField"
