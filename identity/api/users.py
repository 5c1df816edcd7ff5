"""Users of tenants, managed by their tenant's managers and by platform admins.

Every lookup goes through ``selectors.users_visible_to``: another tenant's user
is a 404 for a manager, exactly like a user that does not exist.
"""

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
    UserListQuerySerializer,
    UserRegisterSerializer,
    UserSerializer,
    UserUpdateSerializer,
)
from identity.permissions import IsPlatformAdmin, IsTenantManager

TAG = "users"
NOT_FOUND = error_response("No such user (or not yours to see).")
MANAGERS = [IsPlatformAdmin | IsTenantManager]


@extend_schema(tags=[TAG])
class UserCollectionApi(NeverDeleted, APIView):
    permission_classes = MANAGERS
    pagination_class = DefaultPagination

    @extend_schema(
        parameters=[UserListQuerySerializer],
        responses=UserSerializer(many=True),
        summary="List users (a manager sees their tenant's)",
    )
    def get(self, request):
        filters = query(UserListQuerySerializer, request)
        users = selectors.user_list(
            caller=request.user,
            is_active=filters["is_active"],
            search=filters["search"],
            tenant_id=filters.get("tenant"),
        )
        return paginated(self, users, UserSerializer)

    @create_schema(
        UserSerializer,
        request=UserRegisterSerializer,
        not_found=error_response("No such tenant."),
        conflicts="The email is taken or the tenant is deactivated.",
        summary="Register a user in a tenant",
    )
    def post(self, request):
        data = validated(UserRegisterSerializer, request.data)
        tenant = selectors.tenant_for_registration(
            caller=request.user, tenant_id=data.pop("tenant", None)
        )
        user = services.user_register(tenant=tenant, **data, actor=request.user)
        return Response(UserSerializer(user).data, status=status.HTTP_201_CREATED)


@extend_schema(tags=[TAG])
class UserDetailApi(NeverDeleted, APIView):
    permission_classes = MANAGERS
    delete_hint = "Users are never deleted: POST /api/v1/users/{user_id}/deactivate instead."

    @extend_schema(responses={200: UserSerializer, 404: NOT_FOUND}, summary="Read a user")
    def get(self, request, user_id: int):
        user = selectors.user_for_caller(caller=request.user, user_id=user_id)
        return Response(UserSerializer(user).data)

    @change_schema(
        UserSerializer,
        request=UserUpdateSerializer,
        not_found=NOT_FOUND,
        conflicts="The user is deactivated.",
        summary="Change a user's name or role",
    )
    def patch(self, request, user_id: int):
        user = selectors.user_for_caller(caller=request.user, user_id=user_id)
        data = validated(UserUpdateSerializer, request.data)
        user = services.user_update(user=user, **data, actor=request.user)
        return Response(UserSerializer(user).data)


@extend_schema(tags=[TAG])
class UserDeactivateApi(APIView):
    permission_classes = MANAGERS

    @change_schema(
        UserSerializer,
        not_found=NOT_FOUND,
        conflicts="Already deactivated, or the caller themselves.",
        summary="Deactivate a user: ends their sessions and blocks login",
    )
    def post(self, request, user_id: int):
        user = selectors.user_for_caller(caller=request.user, user_id=user_id)
        user = services.user_deactivate(user=user, actor=request.user)
        return Response(UserSerializer(user).data)
