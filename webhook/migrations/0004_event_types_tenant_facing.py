"""Endpoints keep only the events of the tenant's jobs (webhook.events.TENANT_EVENT_TYPES).

Before the rule an endpoint could subscribe to the hub's own events (``TaskFailed``, whose
payload is the hub's internal error), and deliveries of them were recorded. Here those
event types leave every endpoint (one that named nothing else is disabled, saying why),
and the deliveries of them still pending end ``failed``: their bodies are never sent.
The list is written out, as a migration must not follow the code's later changes.
"""

from django.db import migrations

TENANT_EVENT_TYPES = ["JobCanceled", "JobCompleted", "JobCreated", "JobFailed", "JobStarted"]
DISABLED_REASON = (
    "It subscribed only to the hub's own events, which endpoints no longer receive; "
    "subscribe it to events of the tenant's jobs and enable it."
)


def keep_tenant_events(apps, schema_editor):
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_deliveries SET status = 'failed', finished_at = now(), "
            "scheduled_run_id = NULL, next_attempt_at = NULL, attempt_started_at = NULL, "
            "last_error = 'not an event of the tenant''s jobs' "
            "WHERE status = 'pending' AND NOT (event_type = ANY(%s))",
            [TENANT_EVENT_TYPES],
        )
        cursor.execute(
            "UPDATE webhook_endpoints SET event_types = ARRAY("
            "  SELECT name FROM unnest(event_types) AS name WHERE name = ANY(%s) ORDER BY name"
            "), updated_at = now() WHERE NOT (event_types <@ %s::text[])",
            [TENANT_EVENT_TYPES, TENANT_EVENT_TYPES],
        )
        cursor.execute(
            "UPDATE webhook_endpoints SET status = 'disabled', disabled_reason = %s, "
            "disabled_at = now() WHERE event_types = '{}' AND status = 'active'",
            [DISABLED_REASON],
        )


class Migration(migrations.Migration):
    dependencies = [
        ("webhook", "0003_webhook_secrets_sealed"),
    ]

    operations = [
        migrations.RunPython(keep_tenant_events, migrations.RunPython.noop, elidable=False),
    ]
