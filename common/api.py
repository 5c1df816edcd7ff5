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
import re
from datetime import UTC
from typing import Any, NoReturn
from urllib import parse

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import InterfaceError, OperationalError
from django.http import Http404, JsonResponse
from django.utils import timezone
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


def page_parameter(request, name: str, *, minimum: int, maximum: int | None = None) -> int | None:
    """The whole number a list's query parameter ``name`` gives (``limit``, ``offset``), or
    None when it is not given: a 400 ``invalid`` naming it when it is not one, or is out of
    bounds. DRF's paginators read such a value as their default instead (``limit=0``,
    ``limit=-1``, ``limit=abc`` a page of 50, ``limit=1000`` a page of 200, ``offset=-1``
    the first page): a page the client did not ask for, answered 200."""
    refuse_repeated(request, name)
    given = request.query_params.get(name)
    if given is None:
        return None
    field = WholeNumberField(min_value=minimum, max_value=maximum)
    try:
        return field.run_validation(given)
    except serializers.ValidationError as exc:
        raise serializers.ValidationError({name: exc.detail}) from None


def _bounded(parameters: list[dict], bounds: dict[str, dict[str, int]]) -> list[dict]:
    """The paginator's query parameters in the schema, with the bounds it enforces."""
    for parameter in parameters:
        parameter["schema"].update(bounds.get(parameter["name"], {}))
    return parameters


class DefaultPagination(LimitOffsetPagination):
    """Pages by ``limit`` (1 to 200, 50 by default) and ``offset`` (0 or more); a value
    outside those is a 400 ``invalid``."""

    default_limit = 50
    max_limit = 200

    def get_limit(self, request) -> int:
        limit = page_parameter(request, self.limit_query_param, minimum=1, maximum=self.max_limit)
        return self.default_limit if limit is None else limit

    def get_offset(self, request) -> int:
        offset = page_parameter(request, self.offset_query_param, minimum=0)
        return 0 if offset is None else offset

    def get_schema_operation_parameters(self, view):
        return _bounded(
            super().get_schema_operation_parameters(view),
            {
                self.limit_query_param: {"minimum": 1, "maximum": self.max_limit},
                self.offset_query_param: {"minimum": 0},
            },
        )


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

    def get_page_size(self, request) -> int:
        # 1 to ``max_page_size``; outside that, a 400 (as ``DefaultPagination``'s limit).
        size = page_parameter(
            request, self.page_size_query_param, minimum=1, maximum=self.max_page_size
        )
        return self.page_size if size is None else size

    def get_schema_operation_parameters(self, view):
        return _bounded(
            super().get_schema_operation_parameters(view),
            {self.page_size_query_param: {"minimum": 1, "maximum": self.max_page_size}},
        )

    def decode_cursor(self, request):
        refuse_repeated(request, self.cursor_query_param)
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


def query_values(request) -> dict[str, str]:
    """The request's query parameters, each with its one value: a 400 ``invalid`` naming
    those given more than once (``?status=running&status=failed``).

    A plain dict, not the ``QueryDict``: DRF reads a ``QueryDict`` as an HTML form, where a
    field sent empty is a field left out (``?automation=`` would list every automation's
    jobs, the filter dropped without a word), and a repeated parameter as its last value
    (the others dropped as silently). A list of values is one parameter, comma-separated
    (``status=running,failed``).
    """
    refuse_repeated(request, *request.query_params)
    return request.query_params.dict()


def refuse_repeated(request, *names: str) -> None:
    """A 400 ``invalid`` naming each of the query parameters ``names`` given more than once."""
    repeated = sorted(name for name in names if len(request.query_params.getlist(name)) > 1)
    if repeated:
        raise serializers.ValidationError(
            {name[:200]: ["Given more than once: give it once."] for name in repeated}
        )


def validated_query(serializer_class: type[serializers.Serializer], request) -> dict[str, Any]:
    """The request's query parameters (``query_values``) checked by ``serializer_class``:
    its validated data, or a 400 ``invalid``. An empty value is a value, refused by any
    field that does not allow it."""
    return validated(serializer_class, query_values(request))


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


# A whole number written as text: ASCII digits, a minus at most.
_WHOLE_NUMBER_TEXT = re.compile(r"-?[0-9]+")


class WholeNumberField(serializers.IntegerField):
    """A whole number: a JSON integer (or a number with nothing after its point, ``5.0``),
    or, as a query parameter carries it, a string of ASCII digits with a minus at most.

    DRF's own field reads a string with ``int()``, which also takes ``"1_0"`` (ten),
    ``"+5"``, ``" 5 "`` and the digits of other scripts (an Arabic-Indic five): a value
    the client did not write, taken as if it had. Every whole number the API reads goes through this
    field (``tests/common/test_whole_numbers.py`` checks that none is left out)."""

    def to_internal_value(self, data):
        if (
            isinstance(data, str)
            and len(data) <= self.MAX_STRING_LENGTH
            and not _WHOLE_NUMBER_TEXT.fullmatch(data)
        ):
            self.fail("invalid")
        return super().to_internal_value(data)


class AwareDateTimeField(serializers.DateTimeField):
    """An ISO 8601 instant with its offset (``2026-12-01T09:00:00Z``, ``…+01:00``): a time
    without one (``2026-12-01T09:00:00``, or a date alone) names no instant, so it is
    refused rather than guessed. For the lists' time filters."""

    default_error_messages = {
        "naive": "Give the time with its offset (Z or ±hh:mm).",
    }

    def enforce_timezone(self, value):
        if timezone.is_naive(value):
            self.fail("naive")
        return super().enforce_timezone(value)


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
