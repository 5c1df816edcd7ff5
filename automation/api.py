"""The automations API: thin views, one service call each.

Every person reads active automations; platform admins also see retired ones, see the
worker's machine, and are the only ones who write. Creating an automation (and rotating
its worker's credential) returns the worker's credential once: it is not stored, only its
hash. Automations are never deleted: ``DELETE`` is refused and points to
``POST /api/v1/automations/{id}/deactivate``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.response import Response
from rest_framework.views import APIView

from automation.authentication import WorkerAuthentication
from automation.models import AUTOMATION_FIELDS, Automation, Worker
from automation.permissions import IsWorker
from automation.selectors import automation_for_caller, automation_list
from automation.services import (
    automation_create,
    automation_deactivate,
    automation_update,
    worker_rotate_credential,
    worker_seen,
)
from common.api import NeverDeleted, PartialUpdate, WholeNumberField, validated, validated_query
from common.schema import change_schema, create_schema, refused_delete
from identity.permissions import IsPlatformAdmin, ReadForPeopleWriteForAdmins, is_platform_admin

CREDENTIAL_HELP = "The worker's credential. Shown this once: only its hash is kept."


@extend_schema_field({"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1})
class CommandField(serializers.JSONField):
    """The argument list the worker executes (no shell)."""


@extend_schema_field({"type": "object", "nullable": True, "additionalProperties": True})
class JsonSchemaField(serializers.JSONField):
    """A JSON Schema (draft 2020-12) for the job parameters; null accepts any object."""


class WorkerSerializer(serializers.ModelSerializer):
    class Meta:
        model = Worker
        fields = (
            "id",
            "provider",
            "machine_id",
            "region",
            "status",
            "last_seen_at",
            "credential_prefix",
            "credential_rotated_at",
            "is_active",
        )
        read_only_fields = fields


class WorkerWithCredentialSerializer(WorkerSerializer):
    credential = serializers.SerializerMethodField(help_text=CREDENTIAL_HELP)

    class Meta(WorkerSerializer.Meta):
        fields = (*WorkerSerializer.Meta.fields, "credential")
        read_only_fields = fields

    def get_credential(self, worker: Worker) -> str:
        return self.context["credential"]


class AutomationSerializer(serializers.ModelSerializer):
    sector = serializers.IntegerField(source="sector_id", read_only=True)
    command = CommandField(read_only=True)
    params_schema = JsonSchemaField(read_only=True)
    worker = serializers.SerializerMethodField(
        help_text="The automation's worker; null unless the caller is a platform admin."
    )

    class Meta:
        model = Automation
        fields = (
            "id",
            *AUTOMATION_FIELDS,
            "is_active",
            "created_at",
            "updated_at",
            "deactivated_at",
            "worker",
        )
        read_only_fields = fields

    @extend_schema_field(WorkerSerializer(allow_null=True))
    def get_worker(self, automation: Automation) -> dict[str, Any] | None:
        if not self.context.get("with_worker"):
            return None
        return WorkerSerializer(automation.worker).data


class AutomationCreatedSerializer(AutomationSerializer):
    """The new automation, with its worker's credential (this response only)."""

    @extend_schema_field(WorkerWithCredentialSerializer)
    def get_worker(self, automation: Automation) -> dict[str, Any]:
        return WorkerWithCredentialSerializer(automation.worker, context=self.context).data


class WorkerMachineSerializer(serializers.Serializer):
    provider = serializers.ChoiceField(choices=Worker.Provider.choices, default="local")
    machine_id = serializers.CharField(
        max_length=200,
        allow_blank=True,
        default="",
        help_text="The provider's id of the machine (an EC2 instance id for `ec2`).",
    )
    region = serializers.CharField(max_length=64, allow_blank=True, default="")


class WorkerMachineUpdateSerializer(PartialUpdate):
    provider = serializers.ChoiceField(choices=Worker.Provider.choices, required=False)
    machine_id = serializers.CharField(max_length=200, allow_blank=True, required=False)
    region = serializers.CharField(max_length=64, allow_blank=True, required=False)


class AutomationCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=200)
    slug = serializers.CharField(
        max_length=120,
        required=False,
        allow_blank=True,
        help_text="Derived from the name if blank.",
    )
    description = serializers.CharField(required=False, allow_blank=True, default="")
    sector = WholeNumberField(help_text="An active sector's id.")
    command = CommandField()
    max_concurrency = WholeNumberField(
        required=False, default=1, help_text="Jobs that may run at the same time (at least 1)."
    )
    timeout_seconds = WholeNumberField(required=False, default=3600)
    max_attempts = WholeNumberField(required=False, default=1)
    params_schema = JsonSchemaField(required=False, allow_null=True, default=None)
    worker = WorkerMachineSerializer(required=False)


class AutomationUpdateSerializer(PartialUpdate):
    name = serializers.CharField(max_length=200, required=False)
    slug = serializers.CharField(max_length=120, required=False)
    description = serializers.CharField(required=False, allow_blank=True)
    sector = WholeNumberField(required=False)
    command = CommandField(required=False)
    max_concurrency = WholeNumberField(required=False)
    timeout_seconds = WholeNumberField(required=False)
    max_attempts = WholeNumberField(required=False)
    params_schema = JsonSchemaField(required=False, allow_null=True)
    worker = WorkerMachineUpdateSerializer(
        required=False, help_text="A different machine re-registers the worker."
    )


class AutomationFilterSerializer(serializers.Serializer):
    active = serializers.BooleanField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Platform admins only; everyone else sees active automations only.",
    )
    sector = WholeNumberField(required=False, min_value=1, default=None)
    search = serializers.CharField(required=False, allow_blank=True, max_length=200, default="")


def represent(request, automation: Automation) -> dict[str, Any]:
    context = {"with_worker": is_platform_admin(request)}
    return AutomationSerializer(automation, context=context).data


@extend_schema_view(
    get=extend_schema(operation_id="automations_list", parameters=[AutomationFilterSerializer])
)
class AutomationListCreateApi(ReadForPeopleWriteForAdmins, generics.ListAPIView):
    serializer_class = AutomationSerializer

    def get_queryset(self) -> QuerySet[Automation]:
        filters = validated_query(AutomationFilterSerializer, self.request)
        return automation_list(
            caller=self.request.user,
            active=filters["active"],
            sector_id=filters["sector"],
            search=filters["search"],
        )

    def get_serializer_context(self) -> dict[str, Any]:
        return {**super().get_serializer_context(), "with_worker": is_platform_admin(self.request)}

    @create_schema(
        AutomationCreatedSerializer,
        request=AutomationCreateSerializer,
        conflicts="`automation_slug_taken`.",
        operation_id="automations_create",
    )
    def post(self, request):
        data = validated(AutomationCreateSerializer, request.data)
        machine = data.pop("worker", None) or {}
        created = automation_create(
            actor=request.user, sector_id=data.pop("sector"), **data, **machine
        )
        body = AutomationCreatedSerializer(
            created.automation, context={"credential": created.credential}
        ).data
        return Response(body, status=status.HTTP_201_CREATED)


class AutomationDetailApi(ReadForPeopleWriteForAdmins, NeverDeleted, APIView):
    delete_hint = (
        "Automations are never deleted: "
        "POST /api/v1/automations/{automation_id}/deactivate instead."
    )

    @extend_schema(operation_id="automations_read", responses={200: AutomationSerializer})
    def get(self, request, automation_id: int):
        automation = automation_for_caller(caller=request.user, automation_id=automation_id)
        return Response(represent(request, automation))

    @change_schema(
        AutomationSerializer,
        request=AutomationUpdateSerializer,
        conflicts=(
            "`automation_inactive` (retired automations are read-only) or `automation_slug_taken`."
        ),
        operation_id="automations_update",
    )
    def patch(self, request, automation_id: int):
        data = validated(AutomationUpdateSerializer, request.data)
        machine = data.pop("worker", None)
        if "sector" in data:
            data["sector_id"] = data.pop("sector")
        automation = automation_update(
            automation_id=automation_id, data=data, machine=machine, actor=request.user
        )
        return Response(represent(request, automation))

    delete = refused_delete(
        operation_id="automations_delete", description="Always: automations are deactivated."
    )


class AutomationDeactivateApi(APIView):
    permission_classes = [IsPlatformAdmin]

    @change_schema(
        AutomationSerializer,
        conflicts="`automation_inactive`: already deactivated.",
        operation_id="automations_deactivate",
    )
    def post(self, request, automation_id: int):
        automation = automation_deactivate(automation_id=automation_id, actor=request.user)
        return Response(represent(request, automation))


class WorkerRotateCredentialApi(APIView):
    permission_classes = [IsPlatformAdmin]

    @change_schema(
        WorkerWithCredentialSerializer,
        conflicts="`automation_inactive` or `worker_inactive`: a retired worker.",
        operation_id="automations_worker_rotate_credential",
    )
    def post(self, request, automation_id: int):
        rotated = worker_rotate_credential(automation_id=automation_id, actor=request.user)
        body = WorkerWithCredentialSerializer(
            rotated.worker, context={"credential": rotated.credential}
        ).data
        return Response(body)


class WorkerAutomationSerializer(serializers.ModelSerializer):
    command = CommandField(read_only=True)

    class Meta:
        model = Automation
        fields = ("id", "slug", "name", "command", "timeout_seconds", "max_concurrency")
        read_only_fields = fields


class WorkerMeSerializer(serializers.Serializer):
    worker = serializers.IntegerField(source="id", read_only=True, help_text="The worker's id.")
    automation = WorkerAutomationSerializer(
        read_only=True, help_text="What this worker runs, and how."
    )


class WorkerMeApi(APIView):
    """The calling worker and what its automation runs: the worker reads it at start."""

    authentication_classes = [WorkerAuthentication]
    permission_classes = [IsWorker]

    @extend_schema(
        operation_id="worker_me",
        summary="The calling worker and its automation's command, timeout and limit",
        responses={200: WorkerMeSerializer},
    )
    def get(self, request):
        worker = request.user
        worker_seen(worker_id=worker.pk)
        return Response(WorkerMeSerializer(worker).data)
