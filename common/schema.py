"""OpenAPI pieces shared by every module's views."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema_serializer
from rest_framework import serializers


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
