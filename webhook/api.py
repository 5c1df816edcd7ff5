"""The webhooks API: a tenant's managers register endpoints and watch their deliveries.

The signing secret appears in two answers only: the creation's and the rotation's. Endpoints
are never deleted: ``DELETE`` is refused and points to the ``disable`` action.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers, status
from rest_framework.generics import GenericAPIView
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NeverDeleted, NewestFirstCursorPagination, PartialUpdate, validated
from common.schema import change_schema, create_schema, error_response, refused_delete
from identity.permissions import IsTenantManager
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import WebhookEndpoint
from webhook.selectors import attempts_of, delivery_list, endpoint_get, endpoint_list
from webhook.services import (
    URL_MAX_LENGTH,
    endpoint_create,
    endpoint_disable,
    endpoint_enable,
    endpoint_rotate_secret,
    endpoint_update,
)


class EndpointOutput(serializers.ModelSerializer):
    class Meta:
        model = WebhookEndpoint
        fields = (
            "id",
            "url",
            "description",
            "event_types",
            "status",
            "disabled_reason",
            "disabled_at",
            "failing_since",
            "created_at",
            "updated_at",
        )
        read_only_fields = fields


class EndpointWithSecretOutput(EndpointOutput):
    secret = serializers.CharField(
        read_only=True,
        help_text="The signing secret (whsec_ + base64), shown in this answer only.",
    )

    class Meta(EndpointOutput.Meta):
        fields = (*EndpointOutput.Meta.fields, "secret")
        read_only_fields = fields


class EndpointCreateInput(serializers.Serializer):
    url = serializers.CharField(max_length=URL_MAX_LENGTH, help_text="An https:// URL.")
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=100),
        min_length=1,
        max_length=100,
        help_text="Events of the tenant's jobs: " + ", ".join(TENANT_EVENT_TYPES) + ".",
    )
    description = serializers.CharField(required=False, allow_blank=True, max_length=500)


class EndpointUpdateInput(PartialUpdate):
    url = serializers.CharField(max_length=URL_MAX_LENGTH, required=False)
    event_types = serializers.ListField(
        child=serializers.CharField(max_length=100), min_length=1, max_length=100, required=False
    )
    description = serializers.CharField(required=False, allow_blank=True, max_length=500)


class DisableInput(serializers.Serializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=500)


class AttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    status_code = serializers.IntegerField(allow_null=True)
    latency_ms = serializers.IntegerField()
    error = serializers.CharField()


class DeliveryOutput(serializers.Serializer):
    id = serializers.IntegerField()
    message_id = serializers.CharField(help_text="The webhook-id header, the same on retries.")
    event_id = serializers.IntegerField()
    event_type = serializers.CharField()
    status = serializers.CharField()
    attempts = serializers.IntegerField()
    status_code = serializers.IntegerField(source="last_status_code", allow_null=True)
    latency_ms = serializers.IntegerField(source="last_latency_ms", allow_null=True)
    error = serializers.CharField(source="last_error")
    next_attempt_at = serializers.DateTimeField(allow_null=True)
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    history = AttemptOutput(many=True, help_text="Every attempt, oldest first.")


_NOT_FOUND = error_response("`webhook_not_found` (also another tenant's endpoint).")


class EndpointsApi(GenericAPIView):
    permission_classes = [IsTenantManager]
    serializer_class = EndpointOutput

    @extend_schema(operation_id="webhooks_list", responses={200: EndpointOutput(many=True)})
    def get(self, request):
        endpoints = endpoint_list(tenant=request.user.tenant_id)
        page = self.paginate_queryset(endpoints)
        return self.get_paginated_response(EndpointOutput(page, many=True).data)

    @create_schema(
        EndpointWithSecretOutput,
        request=EndpointCreateInput,
        invalid=(
            "`invalid`, `webhook_url_refused`, `webhook_unknown_event_type`, "
            "`webhook_event_type_not_allowed`."
        ),
        conflicts=(
            "`endpoint_limit_reached` (the tenant has WEBHOOK_MAX_ENDPOINTS_PER_TENANT "
            "active endpoints; `details.limit`)."
        ),
        operation_id="webhooks_create",
    )
    def post(self, request):
        data = validated(EndpointCreateInput, request.data)
        endpoint = endpoint_create(tenant=request.user.tenant_id, actor=request.user, **data)
        return Response(EndpointWithSecretOutput(endpoint).data, status=status.HTTP_201_CREATED)


class EndpointDetailApi(NeverDeleted, APIView):
    permission_classes = [IsTenantManager]
    delete_hint = (
        "Webhook endpoints are never deleted: POST /api/v1/webhooks/{endpoint_id}/disable instead."
    )

    @extend_schema(
        operation_id="webhooks_retrieve", responses={200: EndpointOutput, 404: _NOT_FOUND}
    )
    def get(self, request, endpoint_id: int):
        endpoint = endpoint_get(tenant=request.user.tenant_id, endpoint_id=endpoint_id)
        return Response(EndpointOutput(endpoint).data)

    @change_schema(
        EndpointOutput,
        request=EndpointUpdateInput,
        invalid=(
            "`invalid`, `webhook_url_refused`, `webhook_unknown_event_type`, "
            "`webhook_event_type_not_allowed`."
        ),
        not_found=_NOT_FOUND,
        operation_id="webhooks_update",
    )
    def patch(self, request, endpoint_id: int):
        data = validated(EndpointUpdateInput, request.data)
        endpoint = endpoint_update(
            tenant=request.user.tenant_id, endpoint_id=endpoint_id, data=data, actor=request.user
        )
        return Response(EndpointOutput(endpoint).data)

    delete = refused_delete(
        operation_id="webhooks_delete", description="Always: endpoints are disabled instead."
    )


class _EndpointMoveApi(APIView):
    # A POST that moves one endpoint through ``service`` and answers it as ``answer``
    # does, as _ScheduleMoveApi moves a schedule; each documents its operation with
    # extend_schema_view.
    permission_classes = [IsTenantManager]
    answer: type[serializers.Serializer] = EndpointOutput

    @staticmethod
    def service(*, tenant: int, endpoint_id: int, actor: Any, **data: Any) -> WebhookEndpoint:
        raise NotImplementedError

    def move_input(self, request) -> dict[str, Any]:
        return {}

    def post(self, request, endpoint_id: int):
        endpoint = self.service(
            tenant=request.user.tenant_id,
            endpoint_id=endpoint_id,
            actor=request.user,
            **self.move_input(request),
        )
        return Response(self.answer(endpoint).data)


@extend_schema_view(
    post=change_schema(
        EndpointWithSecretOutput,
        not_found=_NOT_FOUND,
        conflicts="`webhook_disabled`.",
        operation_id="webhooks_rotate_secret",
        description=(
            "A new signing secret, shown in this answer only. The old one keeps signing "
            "too (a second signature in `webhook-signature`) for WEBHOOK_SECRET_GRACE_SECONDS."
        ),
    )
)
class EndpointRotateSecretApi(_EndpointMoveApi):
    service = staticmethod(endpoint_rotate_secret)
    answer = EndpointWithSecretOutput


@extend_schema_view(
    post=change_schema(
        EndpointOutput,
        request=DisableInput,
        not_found=_NOT_FOUND,
        conflicts="`webhook_disabled`.",
        operation_id="webhooks_disable",
    )
)
class EndpointDisableApi(_EndpointMoveApi):
    service = staticmethod(endpoint_disable)

    def move_input(self, request) -> dict[str, Any]:
        return {"reason": validated(DisableInput, request.data or {}).get("reason", "")}


@extend_schema_view(
    post=change_schema(
        EndpointOutput,
        not_found=_NOT_FOUND,
        conflicts="`webhook_active`, `endpoint_limit_reached`.",
        operation_id="webhooks_enable",
    )
)
class EndpointEnableApi(_EndpointMoveApi):
    service = staticmethod(endpoint_enable)


class CountedDeliveriesPagination(NewestFirstCursorPagination):
    """Newest first by cursor, with ``count`` (every delivery of the endpoint) beside the
    page, as the API's other lists have: one endpoint's deliveries, counted on
    ``webhook_deliveries_recent_idx``, stay few enough to count on each page."""

    def paginate_queryset(self, queryset, request, view=None):
        self.count = queryset.count()
        return super().paginate_queryset(queryset, request, view)

    def get_paginated_response(self, data):
        response = super().get_paginated_response(data)
        response.data = {"count": self.count, **response.data}
        return response

    def get_paginated_response_schema(self, schema):
        paginated = super().get_paginated_response_schema(schema)
        paginated["required"] = ["count", *paginated["required"]]
        paginated["properties"] = {
            "count": {"type": "integer", "example": 123},
            **paginated["properties"],
        }
        return paginated


class EndpointDeliveriesApi(GenericAPIView):
    permission_classes = [IsTenantManager]
    pagination_class = CountedDeliveriesPagination
    serializer_class = DeliveryOutput

    @extend_schema(
        operation_id="webhooks_deliveries",
        summary="An endpoint's recent deliveries, newest first",
        responses={200: DeliveryOutput(many=True), 404: _NOT_FOUND},
    )
    def get(self, request, endpoint_id: int):
        deliveries = delivery_list(tenant=request.user.tenant_id, endpoint_id=endpoint_id)
        page = self.paginate_queryset(deliveries)
        history = attempts_of([delivery.pk for delivery in page])
        for delivery in page:
            delivery.history = history[delivery.pk]
        return self.get_paginated_response(DeliveryOutput(page, many=True).data)
