"""Views that fail on purpose, to check the one error format."""

from django.conf import settings
from django.urls import include, path
from rest_framework import serializers
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.response import Response

from common.errors import Conflict


class EchoSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=5)
    count = serializers.IntegerField(min_value=1)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
def validate(request):
    serializer = EchoSerializer(data=request.data)
    serializer.is_valid(raise_exception=True)
    return Response(serializer.validated_data)


@api_view(["POST"])
@authentication_classes([])
@permission_classes([])
def conflict(request):
    raise Conflict("The job is not pending.", code="not_pending", details={"status": "running"})


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def crash(request):
    raise ZeroDivisionError("a bug")


@api_view(["GET"])
def private(request):
    return Response({})


@api_view(["GET"])
@authentication_classes([])
@permission_classes([])
def crash_in_render(request):
    # Fails after the view, when the response is rendered: outside DRF's exception handler.
    return Response({"not json": object()})


def plain_crash(request):
    # A plain Django view: its local variables appear on the debug page.
    broker_url = settings.RABBITMQ_URL
    raise RuntimeError(f"could not reach the broker ({len(broker_url)} characters of URL)")


handler404 = "common.api.not_found_view"
handler500 = "common.api.server_error_view"

urlpatterns = [
    path("t/validate", validate),
    path("t/conflict", conflict),
    path("t/crash", crash),
    path("t/private", private),
    path("t/plain-crash", plain_crash),
    path("api/t/crash", plain_crash),
    path("health/t/crash", plain_crash),
    path("api/t/crash-in-render", crash_in_render),
    path("", include("hubdommed.urls")),
]
