"""The sectors API: thin views, one service call each.

Everyone authenticated reads active sectors; platform admins also see retired ones and
are the only ones who write. Sectors are never deleted: ``DELETE`` is refused and points
to ``POST /api/v1/sectors/{id}/deactivate``.
"""

from __future__ import annotations

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NeverDeleted, PartialUpdate, validated, validated_query
from common.schema import change_schema, create_schema, refused_delete
from identity.permissions import IsPlatformAdmin, ReadForPeopleWriteForAdmins
from sector.models import Sector
from sector.selectors import sector_for_caller, sector_list
from sector.services import sector_create, sector_deactivate, sector_update


class SectorSerializer(serializers.ModelSerializer):
    class Meta:
        model = Sector
        fields = (
            "id",
            "name",
            "slug",
            "description",
            "is_active",
            "created_at",
            "updated_at",
            "deactivated_at",
        )
        read_only_fields = fields


class SectorCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=120)
    slug = serializers.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        help_text="Derived from the name if blank.",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")


class SectorUpdateSerializer(PartialUpdate):
    name = serializers.CharField(max_length=120, required=False)
    slug = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(required=False, allow_blank=True)


class SectorFilterSerializer(serializers.Serializer):
    active = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Platform admins only; everyone else sees active sectors only.",
    )
    search = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


@extend_schema_view(
    get=extend_schema(operation_id="sectors_list", parameters=[SectorFilterSerializer])
)
class SectorListCreateApi(ReadForPeopleWriteForAdmins, generics.ListAPIView):
    serializer_class = SectorSerializer

    def get_queryset(self) -> QuerySet[Sector]:
        filters = validated_query(SectorFilterSerializer, self.request)
        return sector_list(caller=self.request.user, **filters)

    @create_schema(
        SectorSerializer,
        request=SectorCreateSerializer,
        conflicts="`sector_name_taken` or `sector_slug_taken`.",
        operation_id="sectors_create",
    )
    def post(self, request):
        data = validated(SectorCreateSerializer, request.data)
        sector = sector_create(actor=request.user, **data)
        return Response(SectorSerializer(sector).data, status=status.HTTP_201_CREATED)


class SectorDetailApi(ReadForPeopleWriteForAdmins, NeverDeleted, APIView):
    delete_hint = "Sectors are never deleted: POST /api/v1/sectors/{sector_id}/deactivate instead."

    @extend_schema(operation_id="sectors_read", responses={200: SectorSerializer})
    def get(self, request, sector_id: int):
        sector = sector_for_caller(caller=request.user, sector_id=sector_id)
        return Response(SectorSerializer(sector).data)

    @change_schema(
        SectorSerializer,
        request=SectorUpdateSerializer,
        conflicts=(
            "`sector_inactive` (retired sectors are read-only), `sector_name_taken` "
            "or `sector_slug_taken`."
        ),
        operation_id="sectors_update",
    )
    def patch(self, request, sector_id: int):
        data = validated(SectorUpdateSerializer, request.data)
        sector = sector_update(sector_id=sector_id, data=data, actor=request.user)
        return Response(SectorSerializer(sector).data)

    delete = refused_delete(
        operation_id="sectors_delete", description="Always: sectors are deactivated instead."
    )


class SectorDeactivateApi(APIView):
    permission_classes = [IsPlatformAdmin]

    @change_schema(
        SectorSerializer,
        conflicts="`sector_in_use` or `sector_inactive`.",
        operation_id="sectors_deactivate",
    )
    def post(self, request, sector_id: int):
        sector = sector_deactivate(sector_id=sector_id, actor=request.user)
        return Response(SectorSerializer(sector).data)
