"""OpenAPI pieces shared by every module's views.

``AutoSchema`` documents the errors each operation can answer, once for all views, from
what the view is made of: its authentication, permissions and throttles, its input (a
body, query or header parameters) and its path (an object to look up). What only a
service knows (a 409 conflict, a 404 for an id in the body) stays declared on the view;
this class gives every declared error the error format too.
"""

from __future__ import annotations

from typing import Any, NoReturn

from drf_spectacular import openapi
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer
from rest_framework import permissions, serializers


@extend_schema_serializer(component_name="ErrorBody")
class ErrorBodySerializer(serializers.Serializer):
    code = serializers.CharField(help_text="Stable and machine-readable.")
    message = serializers.CharField(help_text="For people.")
    details = serializers.DictField(help_text="Field errors (field -> messages) or context.")


@extend_schema_serializer(component_name="Error")
class ErrorSerializer(serializers.Serializer):
    """The one error format of the API: ``{"error": {"code", "message", "details"}}``."""

    error = ErrorBodySerializer()


def error_response(description: str) -> OpenApiResponse:
    """A documented failure in the one error format."""
    return OpenApiResponse(ErrorSerializer, description=description)


def refused_delete(*, operation_id: str, description: str):
    """The ``delete`` of a ``common.api.NeverDeleted`` view that shows its 405 in the schema.

    ``delete = refused_delete(operation_id="sectors_delete", description="Always: ...")``
    """

    @extend_schema(
        operation_id=operation_id, request=None, responses={405: error_response(description)}
    )
    def delete(self, request, **url_kwargs: Any) -> NoReturn:
        self.refuse_delete(**url_kwargs)

    return delete


def change_schema(
    answer: Any,
    *,
    request: Any = None,
    invalid: str | None = None,
    not_found: OpenApiResponse | None = None,
    conflicts: str | OpenApiResponse | None = None,
    **documented: Any,
):
    """``extend_schema`` for an operation that changes one object: a PATCH, or a POST that
    moves it (deactivate, pause, enable...). No body unless ``request`` is given, the object
    back as ``answer``, and the refusals that only the service knows of, where the view
    declares them: a 400 ``invalid``, a 404 ``not_found``, a 409 ``conflicts``.
    ``documented`` is the rest (``operation_id``, ``summary``...)."""
    responses = _refusals(invalid=invalid, not_found=not_found, conflicts=conflicts)
    return extend_schema(request=request, responses={200: answer, **responses}, **documented)


def create_schema(
    answer: Any,
    *,
    request: Any,
    conflicts: str | OpenApiResponse,
    not_found: OpenApiResponse | None = None,
    invalid: str | None = None,
    **documented: Any,
):
    """``extend_schema`` for a POST that creates one object from ``request``: the new
    object back (201) as ``answer``, and the refusals only the service knows of, as for
    ``change_schema``."""
    responses = _refusals(invalid=invalid, not_found=not_found, conflicts=conflicts)
    return extend_schema(request=request, responses={201: answer, **responses}, **documented)


def _refusals(
    *,
    invalid: str | None,
    not_found: OpenApiResponse | None,
    conflicts: str | OpenApiResponse | None,
) -> dict[int, OpenApiResponse]:
    responses: dict[int, OpenApiResponse] = {}
    if invalid is not None:
        responses[400] = error_response(invalid)
    if not_found is not None:
        responses[404] = not_found
    if conflicts is not None:
        responses[409] = error_response(conflicts) if isinstance(conflicts, str) else conflicts
    return responses


# What each automatic error answer says when the view declared nothing more precise.
ERROR_DESCRIPTIONS = {
    "400": "`invalid` (details: field -> messages) or `malformed_request` (not JSON).",
    "401": "`not_authenticated` (no credential) or a credential refused "
    "(`invalid_token`, `token_expired`, `authentication_failed`...).",
    "403": "`forbidden`: this caller may not do this.",
    "404": "`not_found`: no such object (or not one this caller may see).",
    "405": "`method_not_allowed`.",
    "413": "`too_large`: the request body is over the size limit.",
    "415": "`unsupported_media_type`: send `Content-Type: application/json`.",
    "429": "`throttled`: too many requests; retry after `Retry-After` seconds "
    "(also in `details.retry_after_seconds`).",
}

# Permissions that refuse nobody who authenticated: a failure with them is a 401, never a 403.
_IDENTITY_ONLY = (permissions.AllowAny, permissions.IsAuthenticated)


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry):
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation.setdefault("responses", {})
        for code in self._error_codes(operation):
            responses.setdefault(code, {"description": ERROR_DESCRIPTIONS[code]})
        for code, response in responses.items():
            if int(code) >= 400:
                self._in_error_format(code, response)
        operation["responses"] = dict(sorted(responses.items()))
        return operation

    def _error_codes(self, operation: dict[str, Any]) -> set[str]:
        parameters = operation.get("parameters", [])
        reads_body = "requestBody" in operation
        codes: set[str] = set()
        if reads_body or any(p["in"] in ("query", "header") for p in parameters):
            codes.add("400")
        if reads_body:
            codes |= {"413", "415"}
        if any(p["in"] == "path" for p in parameters):
            codes.add("404")
        if self.view.get_authenticators():
            # Any credential sent is checked, even where none is required.
            codes.add("401")
        if any(_may_refuse_the_authenticated(p) for p in self.view.get_permissions()):
            codes.add("403")
        if self.view.get_throttles():
            codes.add("429")
        return codes

    def _in_error_format(self, code: str, response: dict[str, Any]) -> None:
        if "content" in response:
            return
        documented = self._get_response_for_code(ErrorSerializer, code)
        response["content"] = documented["content"]
        if not response.get("description"):
            response["description"] = ERROR_DESCRIPTIONS.get(code, "An error.")


def _may_refuse_the_authenticated(permission: permissions.BasePermission) -> bool:
    # A permission that only says which kind of caller it is for (a person, a worker)
    # declares ``identity_only``: an authenticated caller of that kind always passes it.
    if isinstance(permission, _IDENTITY_ONLY):
        return False
    return not getattr(permission, "identity_only", False)
