"""Standard Webhooks signing (https://www.standardwebhooks.com): secrets and headers.

``webhook-signature`` is ``v1,<base64 HMAC-SHA256 of "<webhook-id>.<webhook-timestamp>.<body>">``
keyed with the secret's bytes (the base64 after ``whsec_``); one signature per secret in
use, space-separated, during a rotation.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import UTC, datetime

from standardwebhooks import Webhook

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
# 32 random bytes: the spec asks for 24 to 64.
SECRET_BYTES = 32


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def new_message_id() -> str:
    return f"msg_{uuid.uuid4().hex}"


def signed_headers(
    *, message_id: str, body: str, secrets_in_use: list[str], at: datetime
) -> dict[str, str]:
    """The three headers for one attempt; the timestamp is the attempt's, in whole seconds."""
    at = at.astimezone(UTC)
    signatures = " ".join(
        Webhook(secret).sign(msg_id=message_id, timestamp=at, data=body)
        for secret in secrets_in_use
    )
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signatures,
    }
