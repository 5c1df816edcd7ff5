from django.apps import AppConfig


class WebhookConfig(AppConfig):
    name = "webhook"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from outbox.listeners import register_event_listener
        from webhook.delivery import deliveries_record

        # Every event of a tenant may become deliveries, in the event's own transaction.
        register_event_listener("webhook.deliveries", deliveries_record)
