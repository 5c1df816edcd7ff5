from django.apps import AppConfig


class WebhookConfig(AppConfig):
    name = "webhook"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from common.ways_forward import register_stranded_check
        from outbox.listeners import register_event_listener
        from webhook.recording import deliveries_record, deliveries_record_many, deliveries_wanted
        from webhook.stranded import deliveries_stranded
        from webhook.stranded_secrets import secrets_stranded

        # Every event of a tenant may become deliveries, in the event's own transaction
        # (the events of one publish_many read their endpoints together); the event's own
        # statement tells whether any endpoint wants it.
        register_event_listener(
            "webhook.deliveries",
            deliveries_record,
            batch=deliveries_record_many,
            interest=deliveries_wanted,
        )
        # The monitor's check that every pending delivery keeps a way forward.
        register_stranded_check("webhook_deliveries", deliveries_stranded)
        # A previous secret past its grace that its run did not erase.
        register_stranded_check("webhook_secrets", secrets_stranded)
