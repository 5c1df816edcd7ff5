"""``Authorization: Bearer <worker credential>`` for an automation's worker."""

from __future__ import annotations

import hashlib
import hmac
import secrets

from rest_framework import exceptions

from identity.authentication import BearerAuthentication

CREDENTIAL_PREFIX = "hdw_"


def new_credential() -> str:
    """A fresh worker credential: shown once, stored only as its hash."""
    return CREDENTIAL_PREFIX + secrets.token_urlsafe(32)


def hash_credential(credential: str) -> str:
    return hashlib.sha256(credential.encode()).hexdigest()


class WorkerAuthentication(BearerAuthentication):
    """Authenticates a worker; ``request.user`` is the ``Worker``."""

    realm = "worker"

    def authenticate_credential(self, credential: str):
        if not credential.startswith(CREDENTIAL_PREFIX):
            raise exceptions.AuthenticationFailed(
                "Invalid worker credential.", code="invalid_token"
            )
        from automation.models import Worker

        digest = hash_credential(credential)
        worker = (
            Worker.objects.select_related("automation")
            .filter(credential_hash=digest, is_active=True, automation__is_active=True)
            .first()
        )
        # The lookup is by hash; compare again in constant time all the same.
        if worker is None or not hmac.compare_digest(worker.credential_hash, digest):
            raise exceptions.AuthenticationFailed(
                "Invalid worker credential.", code="invalid_token"
            )
        return worker, None
