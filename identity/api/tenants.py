"""Tenants, run by platform admins: create, list, read, rename, deactivate."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import DefaultPagination, NeverDeleted, validated
from common.schema import change_schema, create_schema, error_response
from identity import selectors, services
from identity.api.common import paginated, query
from identity.api.serializers import (
    TenantCreateSerializer,
    TenantListQuerySerializer,
    TenantRenameSerializer,
    TenantSerializer,
)
from identity.permissions import IsPlatformAdmin

TAG = "tenants"
NOT_FOUND = error_response("No such tenant.")
CONFLICT = error_response("The tenant is deactivated.")


@extend_schema(tags=[TAG])
class TenantCollectionApi(NeverDeleted, APIView):
    permission_classes = [IsPlatformAdmin]
    pagination_class = DefaultPagination

    @extend_schema(
        parameters=[TenantListQuerySerializer],
        responses=TenantSerializer(many=True),
        summary="List tenants",
    )
    def get(self, request):
        filters = query(TenantListQuerySerializer, request)
        return paginated(self, selectors.tenant_list(**filters), TenantSerializer)

    @create_schema(
        TenantSerializer,
        request=TenantCreateSerializer,
        conflicts="The slug is taken.",
        summary="Create a tenant",
    )
    def post(self, request):
        data = validated(TenantCreateSerializer, request.data)
        tenant = services.tenant_create(**data, actor=request.user)
        return Response(TenantSerializer(tenant).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=[TAG])
class TenantDetailApi(NeverDeleted, APIView):
    permission_classes = [IsPlatformAdmin]
    delete_hint = "Tenants are never deleted: POST /api/v1/tenants/{tenant_id}/deactivate instead."

    @extend_schema(responses={200: TenantSerializer, 404: NOT_FOUND}, summary="Read a tenant")
    def get(self, request, tenant_id: int):
        return Response(TenantSerializer(selectors.tenant_for_admin(tenant_id)).data)

    @change_schema(
        TenantSerializer,
        request=TenantRenameSerializer,
        not_found=NOT_FOUND,
        conflicts=CONFLICT,
        summary="Rename a tenant",
    )
    def patch(self, request, tenant_id: int):
        tenant = selectors.tenant_for_admin(tenant_id)
        data = validated(TenantRenameSerializer, request.data)
        tenant = services.tenant_rename(tenant=tenant, name=data["name"], actor=request.user)
        return Response(TenantSerializer(tenant).data)


@extend_schema(tags=[TAG])
class TenantDeactivateApi(APIView):
    permission_classes = [IsPlatformAdmin]

    @change_schema(
        TenantSerializer,
        not_found=NOT_FOUND,
        conflicts=CONFLICT,
        summary="Deactivate a tenant: its users can no longer log in",
    )
    def post(self, request, tenant_id: int):
        tenant = selectors.tenant_for_admin(tenant_id)
        tenant = services.tenant_deactivate(tenant=tenant, actor=request.user)
        return Response(TenantSerializer(tenant).data)
