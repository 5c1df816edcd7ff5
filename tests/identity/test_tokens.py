"""Access tokens signed with the real key but holding claims of the wrong shape are a 401.

Whatever a token says, the answer is ``invalid_token`` in the error format, never a 500:
the key proves who signed it, not that its claims are what the code expects.
"""

from __future__ import annotations

import json
from datetime import timedelta

import jwt
import pytest
from django.conf import settings
from django.utils import timezone

from identity.tokens import ALGORITHM
from tests.identity.support import error_of

pytestmark = pytest.mark.django_db


class _Missing:
    """A claim left out of the token. Its repr names it the same in every process, so the
    parametrized ids below agree between pytest-xdist's workers."""

    def __repr__(self) -> str:
        return "MISSING"


MISSING = _Missing()


def signed(member, **overrides) -> str:
    """A token signed with the hub's own key: good claims for ``member``, then ``overrides``."""
    now = timezone.now()
    claims = {
        "typ": "access",
        "sub": str(member.pk),
        "tid": member.tenant_id,
        "iat": int(now.timestamp()),
        "exp": int((now + timedelta(minutes=5)).timestamp()),
        "jti": "0123456789abcdef",
    }
    for name, value in overrides.items():
        if value is MISSING:
            claims.pop(name, None)
        else:
            claims[name] = value
    return jwt.encode(claims, settings.ACCESS_TOKEN_SIGNING_KEY, algorithm=ALGORITHM)


def me(api, token: str):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return api.get("/api/v1/me")


def test_a_well_formed_token_signed_with_the_key_opens_me(api, member):
    assert me(api, signed(member)).status_code == 200


@pytest.mark.parametrize(
    "overrides",
    [
        {"sub": "abc"},
        {"sub": ""},
        {"sub": "1.5"},
        {"sub": "-1"},
        {"sub": "0"},
        {"sub": " 1"},
        {"sub": "\uff11"},  # a fullwidth digit: int() reads it, the database would not
        {"sub": "99999999999999999999999"},  # past PostgreSQL's bigint
        {"sub": "1\u0000"},
        {"sub": 1},
        {"sub": None},
        {"sub": ["1"]},
        {"sub": {"id": 1}},
        {"sub": MISSING},
        {"typ": MISSING},
        {"typ": "refresh"},
        {"typ": 1},
        {"typ": ["access"]},
        {"exp": "tomorrow"},
        {"exp": MISSING},
        {"exp": None},
        {"iat": "now"},
        {"iat": MISSING},
        {"iat": None},
        {"iat": 4_102_444_800},  # issued in 2100
        {"nbf": "soon"},
        {"nbf": 4_102_444_800},
        {"tid": "one"},
        {"tid": [1]},
        {"tid": True},
        {"tid": 999_999_999},  # another tenant than the user's
        {"jti": ["x"]},
    ],
    ids=repr,
)
def test_a_token_with_a_malformed_claim_is_a_401(api, member, overrides):
    error_of(me(api, signed(member, **overrides)), 401, "invalid_token")


def test_a_token_whose_subject_is_another_number_than_a_user_is_a_401(api, member):
    response = me(api, signed(member, sub="987654321"))

    assert response.status_code == 401


def test_a_token_that_is_not_a_json_object_is_a_401(api):
    header = jwt.utils.base64url_encode(b'{"alg":"HS256","typ":"JWT"}').decode()
    payload = jwt.utils.base64url_encode(b'["not", "an", "object"]').decode()
    signing_input = f"{header}.{payload}".encode()
    import hashlib
    import hmac

    signature = hmac.new(
        settings.ACCESS_TOKEN_SIGNING_KEY.encode(), signing_input, hashlib.sha256
    ).digest()
    token = f"{header}.{payload}.{jwt.utils.base64url_encode(signature).decode()}"

    error_of(me(api, token), 401, "invalid_token")


@pytest.mark.parametrize(
    "header",
    [
        "Bearer",
        "Bearer a b",
        "Bearer \u00e9t\u00e9",
        "Bearer a\u0000b",
        "Bearer " + "x" * 10_000,
        "Bearer hdw_\u0000",
    ],
    ids=["no token", "two tokens", "not ascii", "nul", "long", "worker nul"],
)
def test_a_malformed_authorization_header_is_a_401_invalid_token(api, header):
    api.credentials(HTTP_AUTHORIZATION=header)

    error_of(api.get("/api/v1/me"), 401, "invalid_token")


@pytest.mark.parametrize(
    "credential",
    ["hdw_", "hdw_\u0000", "hdw_" + "x" * 10_000, "hdr_refresh", "not-a-credential"],
    ids=["prefix only", "nul", "long", "a refresh token", "no prefix"],
)
def test_a_malformed_worker_credential_is_a_401_invalid_token(api, credential):
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {credential}")

    error_of(api.get("/api/v1/worker/me"), 401, "invalid_token")


@pytest.mark.parametrize(
    "token",
    ["", "x", "hdr_", "hdr_\u0000", "hdr_" + "x" * 300, "\ud800"],
    ids=["empty", "short", "prefix only", "nul", "long", "lone surrogate"],
)
def test_a_malformed_refresh_token_is_refused_in_the_error_format(api, token):
    # Sent with JSON escapes, as a client sends a lone surrogate.
    response = api.generic(
        "POST",
        "/api/v1/auth/refresh",
        json.dumps({"refresh_token": token}),
        content_type="application/json",
    )

    assert response.status_code in (400, 401), response.content
    error_of(response, response.status_code)
