"""Sessions: login, refresh, logout, and who the caller is."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import validated
from common.schema import error_response
from identity import services
from identity.api.serializers import (
    LoginSerializer,
    MeSerializer,
    RefreshSerializer,
    TokenPairSerializer,
)
from identity.permissions import IsPerson
from identity.throttling import LoginRateByAddress, LoginRateByEmail

TAG = "auth"


def _token_pair_response(pair: services.TokenPair) -> Response:
    body = {
        "token_type": "Bearer",
        "access_token": pair.access_token,
        "access_token_expires_at": pair.access_token_expires_at,
        "expires_in": max(0, int((pair.access_token_expires_at - timezone.now()).total_seconds())),
        "refresh_token": pair.refresh_token,
        "refresh_token_expires_at": pair.refresh_token_expires_at,
    }
    response = Response(TokenPairSerializer(body).data)
    # Tokens must not be kept by caches along the way.
    response["Cache-Control"] = "no-store"
    return response


@extend_schema(tags=[TAG])
class SessionApi(APIView):
    # The session endpoints take a password or a refresh token, never an access token: an
    # expired access token must not stand in the way of getting a new one. (A comment, not a
    # docstring: the schema would show a docstring as each operation's description.)
    authentication_classes: list = []
    permission_classes = [AllowAny]


@extend_schema(tags=[TAG])
class LoginApi(SessionApi):
    throttle_classes = [LoginRateByAddress, LoginRateByEmail]

    @extend_schema(
        auth=[],
        request=LoginSerializer,
        responses={
            200: TokenPairSerializer,
            401: error_response("Wrong email or password (one error for both)."),
            403: error_response("The account or its tenant is deactivated."),
            429: error_response("Too many attempts; see Retry-After."),
        },
        summary="Log in with email and password",
    )
    def post(self, request):
        data = validated(LoginSerializer, request.data)
        return _token_pair_response(
            services.user_login(email=data["email"], password=data["password"])
        )


@extend_schema(tags=[TAG])
class RefreshApi(SessionApi):
    @extend_schema(
        auth=[],
        request=RefreshSerializer,
        responses={
            200: TokenPairSerializer,
            401: error_response(
                "Unknown, expired, revoked or already used refresh token "
                "(a reused one ends its whole session).",
            ),
        },
        summary="Exchange a refresh token for a new token pair",
    )
    def post(self, request):
        data = validated(RefreshSerializer, request.data)
        return _token_pair_response(services.refresh_token_rotate(token=data["refresh_token"]))


@extend_schema(tags=[TAG])
class LogoutApi(SessionApi):
    @extend_schema(
        auth=[],
        request=RefreshSerializer,
        responses={204: OpenApiResponse(description="The session is ended.")},
        summary="End the session of a refresh token",
    )
    def post(self, request):
        data = validated(RefreshSerializer, request.data)
        services.refresh_token_revoke(token=data["refresh_token"])
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema(tags=[TAG])
class MeApi(APIView):
    permission_classes = [IsPerson]

    @extend_schema(responses=MeSerializer, summary="The calling person")
    def get(self, request):
        return Response(MeSerializer(request.user).data)
