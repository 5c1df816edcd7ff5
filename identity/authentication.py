"""``Authorization: Bearer <access token>`` for people."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from common.context import bind_log_ids
from identity.tokens import InvalidAccessToken, decode_access_token, token_user_id


class BearerAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <credential>``; ``authenticate_credential`` says whose it is."""

    keyword = "Bearer"
    realm: str

    def authenticate(self, request):
        credential = bearer_token(request)
        if credential is None:
            return None
        return self.authenticate_credential(credential)

    def authenticate_credential(self, credential: str) -> tuple[object, object]:
        raise NotImplementedError

    def authenticate_header(self, request) -> str:
        return f'{self.keyword} realm="{self.realm}"'


class AccessTokenAuthentication(BearerAuthentication):
    realm = "api"

    def authenticate_credential(self, token: str):
        try:
            claims = decode_access_token(token)
        except InvalidAccessToken as exc:
            raise exceptions.AuthenticationFailed(str(exc), code=exc.code) from None
        from identity.models import User

        user = (
            User.objects.select_related("tenant")
            .filter(pk=token_user_id(claims), is_active=True)
            .first()
        )
        if user is not None and claims.get("tid") != user.tenant_id:
            # Tokens are issued with the user's tenant; any other is not one of ours.
            raise exceptions.AuthenticationFailed(
                "The access token is invalid.", code="invalid_token"
            )
        if user is None or not user.may_log_in:
            raise exceptions.AuthenticationFailed(
                "The account is not active.", code="account_inactive"
            )
        # The rest of the request's log lines say whose it is (a platform admin has none).
        bind_log_ids(tenant_id=user.tenant_id)
        return user, claims


def bearer_token(request) -> str | None:
    """The token of an ``Authorization: Bearer …`` header, or None when there is none."""
    header = authentication.get_authorization_header(request).split()
    if not header or header[0].lower() != b"bearer":
        return None
    if len(header) != 2:
        raise exceptions.AuthenticationFailed(
            "Malformed Authorization header: expected 'Bearer <token>'.", code="invalid_token"
        )
    try:
        return header[1].decode("ascii")
    except UnicodeDecodeError:
        raise exceptions.AuthenticationFailed(
            "Malformed Authorization header.", code="invalid_token"
        ) from None
