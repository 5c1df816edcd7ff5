"""API plumbing shared by every module: the one error format, pagination, input validation
and the refusal of ``DELETE``.

Every failure leaves the API as::

    {"error": {"code": "not_found", "message": "Not found.", "details": {}}}

``code`` is stable and machine-readable, ``message`` is for people and
``details`` carries field errors or context (for validation: field -> list).
"""

from __future__ import annotations

import base64
import logging
from datetime import UTC
from typing import Any, NoReturn
from urllib import parse

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from django.utils.dateparse import parse_datetime
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import CursorPagination, LimitOffsetPagination
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from common.errors import DomainError, InvalidInput, transaction_conflict

logger = logging.getLogger("hubdommed.api")

# Seconds a client is told to wait when the database is away (a restart takes a few).
RETRY_AFTER_OUTAGE = 5

_DRF_CODES = {
    exceptions.ValidationError: "invalid",
    exceptions.ParseError: "malformed_request",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.PermissionDenied: "forbidden",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    response = _error_response(exc, context)
    # Errors are JSON even where the view offers other formats (the schema's YAML).
    request = context.get("request")
    if request is not None:
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = JSONRenderer.media_type
    return response


def _error_response(exc: Exception, context: dict[str, Any]) -> Response:
    conflict = transaction_conflict(exc) if isinstance(exc, OperationalError) else None
    if conflict is not None:
        view = context.get("view")
        logger.error(
            "transaction aborted by a %s in %s: %s",
            conflict.reason,
            type(view).__name__ if view else "view",
            exc,
        )
        exc = conflict
    if isinstance(exc, DomainError):
        if exc.status_code >= 500:
            logger.error("domain error %s: %s", exc.code, exc.message)
        return Response(error_body(exc.code, exc.message, exc.details), status=exc.status_code)

    if isinstance(exc, OperationalError | InterfaceError):
        # The database went away (a restart, a failover, dropped connections): an outage
        # the client may retry, not a bug. Django drops the dead connection at the end of
        # the request, so the next one reconnects.
        logger.warning("database unavailable: %s", exc)
        return Response(
            error_body("unavailable", "The service is briefly unavailable; try again shortly."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": str(RETRY_AFTER_OUTAGE)},
        )

    if isinstance(exc, RequestDataTooBig):
        # Django refuses to read a body over DATA_UPLOAD_MAX_MEMORY_SIZE: the client's
        # mistake, not ours.
        return Response(
            error_body("too_large", "The request body is too large."),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, DjangoValidationError):
        details = (
            exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        )
        exc = exceptions.ValidationError(details)
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()

    response = drf_exception_handler(exc, context)
    if response is None:
        # A bug, not a refusal: log it with its traceback and keep the format.
        view = context.get("view")
        logger.exception("unhandled error in %s", type(view).__name__ if view else "view")
        return Response(
            error_body("internal_error", "An unexpected error occurred."),
            status=status.HTTP_500_INTERNAL_SERVER_ERROR,
        )

    code = _code_for(exc)
    if isinstance(exc, exceptions.ValidationError):
        details = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        message = "The input is invalid."
        response.data = error_body(code, message, details)
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        details: dict[str, Any] = {}
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            details["retry_after_seconds"] = int(exc.wait + 0.999)
        response.data = error_body(code, str(detail), details)
    return response


def _code_for(exc: Exception) -> str:
    # A code given where the error was raised (AuthenticationFailed(..., code="token_expired"))
    # says more than the class's generic one.
    detail = getattr(exc, "detail", None)
    specific = getattr(detail, "code", None)
    if isinstance(exc, exceptions.APIException) and specific and specific != exc.default_code:
        return specific
    for cls in type(exc).__mro__:
        if cls in _DRF_CODES:
            return _DRF_CODES[cls]
    if isinstance(exc, exceptions.APIException):
        return exc.default_code or "error"
    return "error"


@csrf_exempt
def not_found_view(request, exception=None):
    """``handler404`` for paths outside DRF, and every unknown path under /api/: the same
    format, whatever the method (no CSRF check: there is nothing here to protect)."""
    return JsonResponse(error_body("not_found", "Not found."), status=404)


def server_error_view(request):
    """``handler500`` for errors outside DRF views."""
    return JsonResponse(error_body("internal_error", "An unexpected error occurred."), status=500)


class DefaultPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 200


class NewestFirstCursorPagination(CursorPagination):
    """Keyset pagination for long, append-mostly lists (jobs): cost does not grow with depth.

    A cursor is refused (400 ``invalid_cursor``) unless it is one this API could have
    issued: strict base64 of the fields DRF writes (``o``, ``r``, ``p``), each once, and a
    position of the ordering column's type (``position_valid``). DRF alone reads ``!!!!``
    or any base64 text as the first page, and takes a position it cannot compare as a
    database error.
    """

    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 200

    def decode_cursor(self, request):
        encoded = request.query_params.get(self.cursor_query_param)
        if encoded is None:
            return None
        if not _cursor_fields_valid(encoded):
            raise _invalid_cursor()
        try:
            cursor = super().decode_cursor(request)
        except exceptions.NotFound:
            raise _invalid_cursor() from None
        if cursor.position is not None and not self.position_valid(cursor.position):
            raise _invalid_cursor()
        return cursor

    def position_valid(self, position: str) -> bool:
        """Whether a cursor's position can be compared with the ordering's column: here
        ``created_at``, written with its offset, within the calendar once in UTC."""
        try:
            moment = parse_datetime(position)
            if moment is None or moment.tzinfo is None:
                return False
            # Year 1 east of UTC, or 9999 west of it, falls off the calendar there.
            moment.astimezone(UTC)
        except (ValueError, OverflowError):
            return False
        return True


def _cursor_fields_valid(encoded: str) -> bool:
    try:
        text = base64.b64decode(encoded.encode("ascii"), validate=True).decode("ascii")
        fields = parse.parse_qs(text, keep_blank_values=True, strict_parsing=True)
    except (ValueError, UnicodeError):  # binascii.Error is a ValueError
        return False
    return (
        bool(fields)
        and set(fields) <= {"o", "r", "p"}
        and all(len(values) == 1 for values in fields.values())
    )


def _invalid_cursor() -> InvalidInput:
    return InvalidInput("The cursor is invalid.", code="invalid_cursor")


def validated(serializer_class: type[serializers.Serializer], data) -> dict[str, Any]:
    """``data`` checked by ``serializer_class``: its validated data, or a 400 ``invalid``."""
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


class PartialUpdate(serializers.Serializer):
    """The body of a partial update (PATCH): every field optional, at least one given. A
    body that names none changes nothing, so it is refused, with the fields there are and
    the keys that were not fields (a typo of a field's name): never a 200 that did nothing."""

    def to_internal_value(self, data):
        # The keys given, for ``validate`` (a nested one has no ``initial_data``).
        self._given = list(data) if isinstance(data, dict) else []
        return super().to_internal_value(data)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if not attrs:
            given = getattr(self, "_given", [])
            unknown = sorted(str(key) for key in given if key not in self.fields)
            message = f"Give at least one of: {', '.join(self.fields)}."
            if unknown:
                message = f"Not fields here: {', '.join(unknown)[:200]}. {message}"
            raise serializers.ValidationError(message)
        return attrs


def check_window(attrs: dict[str, Any], after: str, before: str) -> None:
    """A list filter's time window: its end (``before``) later than its start (``after``)
    when both are given, else a 400 ``invalid`` on the end."""
    start, end = attrs.get(after), attrs.get(before)
    if start and end and start >= end:
        raise serializers.ValidationError({before: [f"Must be later than {after}."]})


class NeverDeleted:
    """``DELETE`` answers 405 with a pointer to the way out that exists: deactivation."""

    # The docstring is the operations' description in the schema of views without one of
    # their own: it speaks to the API's readers. For the code's readers: ``delete_hint`` is
    # formatted with the URL's arguments, so it can name the very row
    # ("... POST /api/v1/sectors/{sector_id}/deactivate instead."); a view that documents its
    # DELETE in the schema sets ``delete = common.schema.refused_delete(...)``.
    delete_hint = "Nothing is deleted here; deactivate it instead."

    def refuse_delete(self, **url_kwargs: Any) -> NoReturn:
        raise exceptions.MethodNotAllowed("DELETE", detail=self.delete_hint.format(**url_kwargs))

    def http_method_not_allowed(self, request, *args, **kwargs):
        if request.method == "DELETE":
            self.refuse_delete(**kwargs)
        return super().http_method_not_allowed(request, *args, **kwargs)
