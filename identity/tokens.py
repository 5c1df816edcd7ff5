"""Access tokens: short-lived, signed (HS256 JWT), carrying who the caller is.

Refresh tokens are opaque and live in ``refresh_tokens`` (see the identity
services); access tokens are never stored, so they are kept short.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
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
# A user id as issued: ASCII digits, no sign, no leading zero, within PostgreSQL's bigint.
# (``int()`` alone would also read " 1", fullwidth digits or "1_0", and overflow the column.)
_USER_ID = re.compile(r"[1-9][0-9]{0,18}")
_MAX_BIGINT = 2**63 - 1


class InvalidAccessToken(Exception):
    def __init__(self, message: str, *, code: str = "invalid_token") -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class AccessToken:
    token: str
    expires_at: datetime


def issue_access_token(
    user, *, issued_at: datetime | None = None, jti: str | None = None
) -> AccessToken:
    """A signed access token; the same ``issued_at`` and ``jti`` give the same token again."""
    now = issued_at or timezone.now()
    expires_at = now + settings.ACCESS_TOKEN_LIFETIME
    claims = {
        "typ": TOKEN_TYPE,
        "sub": str(user.pk),
        "tid": user.tenant_id,
        "iat": int(now.timestamp()),
        "exp": int(expires_at.timestamp()),
        "jti": jti or uuid.uuid4().hex,
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
    # The signature proves who made the token, not that its claims have the shape the code
    # reads: each one is checked before anything uses it.
    if claims.get("typ") != TOKEN_TYPE or token_user_id(claims) is None:
        raise InvalidAccessToken("The access token is invalid.")
    tenant_id = claims.get("tid")
    if tenant_id is not None and (type(tenant_id) is not int or tenant_id < 1):
        raise InvalidAccessToken("The access token is invalid.")
    if not isinstance(claims.get("jti", ""), str):
        raise InvalidAccessToken("The access token is invalid.")
    return claims


def token_user_id(claims: dict) -> int | None:
    """The user id of the ``sub`` claim, or None when it is not one the hub issues."""
    subject = claims.get("sub")
    if not isinstance(subject, str) or not _USER_ID.fullmatch(subject):
        return None
    user_id = int(subject)
    return user_id if user_id <= _MAX_BIGINT else None


def _key() -> str:
    return settings.ACCESS_TOKEN_SIGNING_KEY


def new_refresh_token() -> str:
    """A fresh opaque refresh token (256 bits from ``secrets``); only its hash is stored."""
    return REFRESH_TOKEN_PREFIX + secrets.token_urlsafe(32)


def successor_refresh_token(token: str) -> str:
    """The refresh token that replaces ``token`` when it is rotated.

    Derived (an HMAC of the presented token under a server key), not drawn at random, so
    that a refresh racing another one for the same token, within the grace window, can be
    given the same successor again although only its hash is stored. As unguessable as a
    random token without the key; the parent token is needed to compute it at all.
    """
    digest = hmac.new(_successor_key(), token.encode(), hashlib.sha256).digest()
    return REFRESH_TOKEN_PREFIX + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def access_token_id(refresh_token_hash: str) -> str:
    """The ``jti`` of the access token issued with a refresh token: the same pair twice."""
    return hmac.new(_successor_key(), refresh_token_hash.encode(), hashlib.sha256).hexdigest()[:32]


def _successor_key() -> bytes:
    # A key of its own, derived from the signing key: one secret to keep, two uses apart.
    return hmac.new(_key().encode(), b"hubdommed refresh successor", hashlib.sha256).digest()


def hash_refresh_token(token: str) -> str:
    # A plain SHA-256 is enough: the token is random, so there is nothing to brute-force.
    return hashlib.sha256(token.encode()).hexdigest()
