"""Access tokens: short-lived, signed (HS256 JWT), carrying who the caller is.

Refresh tokens are opaque and live in ``refresh_tokens`` (see the identity
services); access tokens are never stored, so they are kept short.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime

import jwt
from django.conf import settings
from django.utils import timezone

ALGORITHM = "HS256"
REFRESH_TOKEN_PREFIX = "hdr_"  # noqa: S105 (a prefix that makes leaked tokens easy to spot)
TOKEN_TYPE = "access"  # noqa: S105 (a claim value, not a secret)


class InvalidAccessToken(Exception):
    def __init__(self, message: str, *, code: str = "invalid_token") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AccessToken:
    token: str
    expires_at: datetime


def issue_access_token(user) -> AccessToken:
    now = timezone.now()
    expires_at = now + settings.ACCESS_TOKEN_LIFETIME
    claims = {
        "typ": TOKEN_TYPE,
        "sub": str(user.pk),
        "tid": user.tenant_id,
        "iat": int(now.timestamp()),
        "exp": int(expires_at.timestamp()),
        "jti": uuid.uuid4().hex,
    }
    return AccessToken(jwt.encode(claims, _key(), algorithm=ALGORITHM), expires_at)


def decode_access_token(token: str) -> dict:
    try:
        claims = jwt.decode(
            token,
            _key(),
            algorithms=[ALGORITHM],
            options={"require": ["exp", "iat", "sub", "typ"]},
            # Decided against our own clock so tests can shift it.
            leeway=0,
        )
    except jwt.ExpiredSignatureError:
        raise InvalidAccessToken("The access token has expired.", code="token_expired") from None
    except jwt.PyJWTError:
        raise InvalidAccessToken("The access token is invalid.") from None
    if claims.get("typ") != TOKEN_TYPE:
        raise InvalidAccessToken("The access token is invalid.")
    return claims


def _key() -> str:
    return settings.ACCESS_TOKEN_SIGNING_KEY


def new_refresh_token() -> str:
    """A fresh opaque refresh token (256 bits from ``secrets``); only its hash is stored."""
    return REFRESH_TOKEN_PREFIX + secrets.token_urlsafe(32)


def hash_refresh_token(token: str) -> str:
    # A plain SHA-256 is enough: the token is random, so there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()
