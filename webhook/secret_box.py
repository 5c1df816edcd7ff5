"""Webhook signing secrets, encrypted at rest.

The hub signs with each endpoint's secret, so it must be able to read it back (a hash would
not do, as it does for worker credentials). The database holds it encrypted with Fernet
(AES-128-CBC with an HMAC-SHA256, from ``cryptography``) under ``WEBHOOK_SECRET_KEYS``: a
copy of the database, a backup or a replica alone gives no secret away. The keys are a list
so that the key can rotate: the first one encrypts, every one decrypts (``MultiFernet``).
To move to a new key, put it first, restart, run ``manage.py reencrypt_webhook_secrets``,
then drop the old one (docs/OPERATIONS.md).

``SealedTextField`` does it for the model: the column holds the token, the instance holds
the secret, so the signing path (``WebhookEndpoint.signing_secrets``) reads secrets as
before. An empty value (no previous secret) stays empty.
"""

from __future__ import annotations

from functools import lru_cache

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import models

# Fernet tokens start with their version byte, 0x80, in URL-safe base64.
TOKEN_PREFIX = "gAAAAA"  # noqa: S105 (a format's prefix, not a secret)


class UnreadableSecret(ImproperlyConfigured):
    """A stored secret that none of WEBHOOK_SECRET_KEYS decrypts."""


@lru_cache(maxsize=4)
def _box(keys: tuple[str, ...]) -> MultiFernet:
    return MultiFernet([Fernet(key) for key in keys])


def box() -> MultiFernet:
    return _box(tuple(settings.WEBHOOK_SECRET_KEYS))


def seal(secret: str) -> str:
    return box().encrypt(secret.encode()).decode("ascii") if secret else ""


def unseal(token: str) -> str:
    if not token:
        return ""
    try:
        return box().decrypt(token.encode("ascii")).decode()
    except (InvalidToken, UnicodeError):
        raise UnreadableSecret(
            "a webhook secret cannot be decrypted with any of WEBHOOK_SECRET_KEYS: was the key "
            "that encrypted it removed before `manage.py reencrypt_webhook_secrets` ran?"
        ) from None


def reseal(token: str) -> str:
    """The same secret encrypted under the first key (what a key rotation needs)."""
    if not token:
        return ""
    try:
        return box().rotate(token.encode("ascii")).decode("ascii")
    except InvalidToken:
        raise UnreadableSecret(
            "a webhook secret cannot be decrypted with any of WEBHOOK_SECRET_KEYS"
        ) from None


def is_sealed(value: str) -> bool:
    return value.startswith(TOKEN_PREFIX)


class SealedTextField(models.TextField):
    """A text column that holds its value encrypted (see the module's docstring). Only
    written and read whole: a lookup by its value would compare tokens, which differ on
    every write."""

    def from_db_value(self, value, expression, connection):
        return value if value is None else unseal(value)

    def get_prep_value(self, value):
        value = super().get_prep_value(value)
        return value if value is None else seal(value)
