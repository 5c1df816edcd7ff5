"""The schedules API: a tenant's calendar of runs of an automation.

Members read their tenant's schedules; managers create, change, pause, resume and
deactivate them. Another tenant's schedule is a 404. Schedules are never deleted:
``DELETE`` is refused and points to ``POST /api/v1/schedules/{id}/deactivate``.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NeverDeleted, PartialUpdate, WholeNumberField, validated, validated_query
from common.schema import change_schema, create_schema, error_response, refused_delete
from identity.permissions import IsTenantManager, ReadForMembersWriteForManagers
from schedule.models import Misfire, Schedule
from schedule.selectors import schedule_get, schedule_list
from schedule.services import (
    schedule_create,
    schedule_deactivate,
    schedule_pause,
    schedule_resume,
    schedule_update,
)

CRON_HELP = (
    "Five fields, ISC/Vixie cron's: minute hour day-of-month month day-of-week, read in "
    "`timezone` (e.g. `0 6 * * 1-5`: weekdays at 06:00). Ranges, lists, steps, names and "
    "`L` (last day of the month); no `W`, `#`, `?` or `@daily`. One with no due time "
    "ahead in its zone is refused."
)
TIMEZONE_HELP = (
    "An IANA time zone name (e.g. `America/Sao_Paulo`, or a link such as `US/Eastern`); "
    "daylight saving follows it."
)
MISFIRE_HELP = (
    "Runs missed by more than the grace (the hub was down): `run_once` starts only the "
    "latest of them, late, when no run within the grace starts; `skip` drops them."
)

_NOT_FOUND = error_response("`schedule_not_found`.")


@extend_schema_field({"type": "object", "additionalProperties": True})
class ParamsField(serializers.JSONField):
    """The parameters of each run, checked against the automation's parameter schema."""


class ScheduleSerializer(serializers.ModelSerializer):
    automation = serializers.IntegerField(source="automation_id", read_only=True)
    created_by = serializers.IntegerField(source="created_by_id", read_only=True, allow_null=True)
    params = ParamsField(read_only=True)
    status = serializers.ChoiceField(
        choices=["active", "paused", "deactivated"],
        read_only=True,
        help_text="`active` runs; `paused` waits for a resume; `deactivated` is for good.",
    )
    next_run_at = serializers.DateTimeField(
        read_only=True,
        allow_null=True,
        help_text="When the next run starts (UTC); null while paused or deactivated.",
    )
    last_run_at = serializers.DateTimeField(
        read_only=True, allow_null=True, help_text="The due time of the latest run started."
    )
    paused_reason = serializers.CharField(
        read_only=True,
        help_text=(
            "Why it is paused (a manager, params the schema refuses, or a calendar that has "
            "no due time left)."
        ),
    )

    class Meta:
        model = Schedule
        fields = (
            "id",
            "name",
            "automation",
            "cron",
            "timezone",
            "params",
            "misfire",
            "status",
            "is_active",
            "next_run_at",
            "last_run_at",
            "paused_at",
            "paused_reason",
            "deactivated_at",
            "deactivated_reason",
            "created_by",
            "created_at",
            "updated_at",
        )
        read_only_fields = fields


class ScheduleCreateSerializer(serializers.Serializer):
    name = serializers.CharField(
        max_length=200,
        required=False,
        allow_blank=True,
        default="",
        help_text="Defaults to the cron expression.",
    )
    automation = WholeNumberField(min_value=1, help_text="An active automation's id.")
    cron = serializers.CharField(max_length=200, help_text=CRON_HELP)
    timezone = serializers.CharField(max_length=64, default="UTC", help_text=TIMEZONE_HELP)
    params = ParamsField(required=False, default=dict)
    misfire = serializers.ChoiceField(
        choices=Misfire.choices, default=Misfire.RUN_ONCE, help_text=MISFIRE_HELP
    )


class ScheduleUpdateSerializer(PartialUpdate):
    name = serializers.CharField(max_length=200, required=False, allow_blank=True)
    cron = serializers.CharField(max_length=200, required=False, help_text=CRON_HELP)
    timezone = serializers.CharField(max_length=64, required=False, help_text=TIMEZONE_HELP)
    params = ParamsField(required=False)
    misfire = serializers.ChoiceField(
        choices=Misfire.choices, required=False, help_text=MISFIRE_HELP
    )


class ScheduleFilterSerializer(serializers.Serializer):
    active = serializers.BooleanField(
        required=False, allow_null=True, default=None, help_text="Only active (or deactivated)."
    )
    automation = WholeNumberField(required=False, min_value=1, default=None)


@extend_schema_view(
    get=extend_schema(
        operation_id="schedules_list",
        summary="The tenant's schedules",
        parameters=[ScheduleFilterSerializer],
    )
)
class ScheduleListCreateApi(ReadForMembersWriteForManagers, generics.ListAPIView):
    serializer_class = ScheduleSerializer

    def get_queryset(self):
        filters = validated_query(ScheduleFilterSerializer, self.request)
        return schedule_list(
            tenant_id=self.request.user.tenant_id,
            active=filters["active"],
            automation_id=filters["automation"],
        )

    @create_schema(
        ScheduleSerializer,
        request=ScheduleCreateSerializer,
        invalid=(
            "`invalid`, `invalid_cron`, `invalid_timezone`, `invalid_name`, "
            "`unknown_automation`, `invalid_params`, `params_too_large`."
        ),
        conflicts=(
            "`automation_inactive`, `automation_misconfigured`, `schedule_limit_reached` "
            "(the tenant has `SCHEDULE_MAX_PER_TENANT` schedules; `details.limit`)."
        ),
        operation_id="schedules_create",
        summary="Create a schedule (managers)",
    )
    def post(self, request):
        data = validated(ScheduleCreateSerializer, request.data)
        schedule = schedule_create(
            tenant=request.user.tenant,
            actor=request.user,
            automation_id=data["automation"],
            name=data["name"],
            cron=data["cron"],
            timezone_name=data["timezone"],
            params=data["params"],
            misfire=data["misfire"],
        )
        return Response(ScheduleSerializer(schedule).data, status=status.HTTP_201_CREATED)


class ScheduleDetailApi(ReadForMembersWriteForManagers, NeverDeleted, APIView):
    delete_hint = (
        "Schedules are never deleted: POST /api/v1/schedules/{schedule_id}/deactivate instead."
    )

    @extend_schema(
        operation_id="schedules_read",
        summary="One of the tenant's schedules",
        responses={200: ScheduleSerializer, 404: _NOT_FOUND},
    )
    def get(self, request, schedule_id: int):
        schedule = schedule_get(tenant_id=request.user.tenant_id, schedule_id=schedule_id)
        return Response(ScheduleSerializer(schedule).data)

    @change_schema(
        ScheduleSerializer,
        request=ScheduleUpdateSerializer,
        invalid=(
            "`invalid`, `invalid_cron`, `invalid_timezone`, `invalid_name`, "
            "`invalid_params`, `params_too_large`."
        ),
        not_found=_NOT_FOUND,
        conflicts="`schedule_inactive`, `automation_misconfigured`.",
        operation_id="schedules_update",
        summary="Change a schedule (managers)",
        description="A new cron expression or time zone takes effect from now.",
    )
    def patch(self, request, schedule_id: int):
        data = validated(ScheduleUpdateSerializer, request.data)
        schedule = schedule_update(
            tenant=request.user.tenant_id, schedule_id=schedule_id, data=data
        )
        return Response(ScheduleSerializer(schedule).data)

    delete = refused_delete(
        operation_id="schedules_delete", description="Always: schedules are deactivated."
    )


class _ScheduleMoveApi(APIView):
    """A POST that moves one schedule through ``service`` (pause, resume, deactivate)."""

    permission_classes = [IsTenantManager]

    @staticmethod
    def service(*, tenant: int, schedule_id: int) -> Schedule:
        raise NotImplementedError

    def post(self, request, schedule_id: int):
        schedule = self.service(tenant=request.user.tenant_id, schedule_id=schedule_id)
        return Response(ScheduleSerializer(schedule).data)


@extend_schema_view(
    post=change_schema(
        ScheduleSerializer,
        not_found=_NOT_FOUND,
        conflicts="`schedule_inactive`.",
        operation_id="schedules_pause",
        summary="Pause a schedule (managers)",
        description="No run starts until it is resumed. Pausing a paused schedule changes nothing.",
    )
)
class SchedulePauseApi(_ScheduleMoveApi):
    service = staticmethod(schedule_pause)


@extend_schema_view(
    post=change_schema(
        ScheduleSerializer,
        invalid=(
            "`invalid_params`, `params_too_large`, `invalid_cron` (the calendar has no "
            "due time left), `invalid_timezone` (this server cannot read the schedule's "
            "zone)."
        ),
        not_found=_NOT_FOUND,
        conflicts="`schedule_inactive`, `automation_inactive`, `automation_misconfigured`.",
        operation_id="schedules_resume",
        summary="Resume a paused schedule (managers)",
        description=(
            "Runs start again from the next due time after now: the runs due while it was "
            "paused are not caught up. Params the automation's schema no longer accepts are "
            "refused: change them first."
        ),
    )
)
class ScheduleResumeApi(_ScheduleMoveApi):
    service = staticmethod(schedule_resume)


@extend_schema_view(
    post=change_schema(
        ScheduleSerializer,
        not_found=_NOT_FOUND,
        conflicts="`schedule_inactive`: already deactivated.",
        operation_id="schedules_deactivate",
        summary="Deactivate a schedule for good (managers)",
    )
)
class ScheduleDeactivateApi(_ScheduleMoveApi):
    service = staticmethod(schedule_deactivate)
