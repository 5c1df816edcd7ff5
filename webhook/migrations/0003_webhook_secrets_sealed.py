"""Webhook signing secrets encrypted at rest (webhook.secret_box).

The columns stay text; the rows written before this hold their secrets in plain text
(``whsec_...``), and are encrypted here under the first of WEBHOOK_SECRET_KEYS, in batches.
A previous secret whose grace has ended is erased on the way, not encrypted;
one still in its grace has no expiry run, and the monitor's ``webhook_secrets`` check erases
it an hour after its grace. Reversed, the
secrets are decrypted again.
"""

from django.db import migrations
from django.utils import timezone

import webhook.secret_box

BATCH = 500


def _rows(connection, condition):
    last_id = 0
    while True:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT id, secret, previous_secret, previous_secret_expires_at "
                f"FROM webhook_endpoints WHERE id > %s AND ({condition}) ORDER BY id LIMIT %s",
                [last_id, BATCH],
            )
            rows = cursor.fetchall()
        if not rows:
            return
        yield rows
        last_id = rows[-1][0]


def _write(connection, pk, secret, previous, expires_at):
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE webhook_endpoints SET secret = %s, previous_secret = %s, "
            "previous_secret_expires_at = %s WHERE id = %s",
            [secret, previous, expires_at, pk],
        )


def seal_existing(apps, schema_editor):
    from webhook.secret_box import is_sealed, seal

    connection = schema_editor.connection
    now = timezone.now()
    for rows in _rows(connection, "secret NOT LIKE 'gAAAAA%%' OR previous_secret <> ''"):
        for pk, secret, previous, expires_at in rows:
            if previous and (expires_at is None or expires_at <= now):
                previous, expires_at = "", None  # its grace is over: nothing to keep
            _write(
                connection,
                pk,
                secret if is_sealed(secret) else seal(secret),
                previous if not previous or is_sealed(previous) else seal(previous),
                expires_at,
            )


def unseal_existing(apps, schema_editor):
    from webhook.secret_box import is_sealed, unseal

    connection = schema_editor.connection
    for rows in _rows(connection, "secret LIKE 'gAAAAA%%' OR previous_secret LIKE 'gAAAAA%%'"):
        for pk, secret, previous, expires_at in rows:
            _write(
                connection,
                pk,
                unseal(secret) if is_sealed(secret) else secret,
                unseal(previous) if is_sealed(previous) else previous,
                expires_at,
            )


class Migration(migrations.Migration):
    dependencies = [
        ("webhook", "0002_delivery_ways_forward"),
    ]

    operations = [
        migrations.AlterField(
            model_name="webhookendpoint",
            name="previous_secret",
            field=webhook.secret_box.SealedTextField(blank=True, default=""),
        ),
        migrations.AlterField(
            model_name="webhookendpoint",
            name="secret",
            field=webhook.secret_box.SealedTextField(),
        ),
        migrations.RunPython(seal_existing, unseal_existing, elidable=False),
    ]
