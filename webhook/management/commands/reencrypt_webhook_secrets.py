"""``manage.py reencrypt_webhook_secrets``: every webhook secret encrypted again under the
first key of ``WEBHOOK_SECRET_KEYS``.

The step of a key rotation between putting the new key first (every process restarted with
it: all of them read both keys, and write with the new one) and removing the old key
(docs/OPERATIONS.md). Safe to run again, and beside the running hub.
"""

from __future__ import annotations

from django.core.management.base import BaseCommand

from webhook.services import endpoint_secrets_expire, endpoint_secrets_reencrypt


class Command(BaseCommand):
    help = "Encrypt every webhook signing secret again under the first of WEBHOOK_SECRET_KEYS."

    def handle(self, *args, **options) -> None:
        # What needs no encrypting any more first: previous secrets past their grace.
        erased = len(endpoint_secrets_expire())
        if erased:
            self.stdout.write(f"{erased} previous secrets past their grace erased")
        count = endpoint_secrets_reencrypt()
        self.stdout.write(f"{count} webhook endpoints' secrets encrypted under the first key")
