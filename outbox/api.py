"""The events API: a tenant's audit trail, ``GET /api/v1/events``.

Tenant managers read their tenant's events; platform admins read every event, the
platform's own (no tenant) among them, and may narrow them to one tenant. Who may call it
is identity's rule, given to the view where its URL is served (``hubdommed/urls.py``); what
a caller may see is decided by ``outbox.selectors.event_list``.
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers
from rest_framework.generics import GenericAPIView
from rest_framework.permissions import BasePermission

from common.api import (
    AwareDateTimeField,
    NewestFirstCursorPagination,
    WholeNumberField,
    check_window,
    query_values,
)
from common.schema import error_response
from outbox.models import Event
from outbox.selectors import event_list

TYPES_MAX = 20
NAME_MAX_LENGTH = 200

# --- who may read it ----------------------------------------------------------------------


class WiredByTheUrl(BasePermission):
    """Nobody, until the URL that serves the view names who may read the trail.

    That is identity's rule (tenant managers and platform admins:
    ``identity.permissions.IsTenantManagerOrPlatformAdmin``), and the outbox stands below
    identity in the layers: ``hubdommed/urls.py``, above both, joins them. A view served
    without it refuses everyone rather than letting any authenticated caller in.
    """

    message = "This list is not served to anyone."

    def has_permission(self, request, view) -> bool:
        return False


# --- input --------------------------------------------------------------------------------


class EventListFilters(serializers.Serializer):
    type = serializers.CharField(
        required=False,
        max_length=TYPES_MAX * (NAME_MAX_LENGTH + 1),
        help_text=f"One event type or several (at most {TYPES_MAX}), comma-separated: "
        "`JobCreated,JobFailed`.",
    )
    aggregate_type = serializers.CharField(
        required=False, max_length=NAME_MAX_LENGTH, help_text="`Job`, `Automation`, `Schedule`…"
    )
    aggregate_id = serializers.CharField(
        required=False,
        max_length=NAME_MAX_LENGTH,
        help_text="One aggregate's events (with aggregate_type only).",
    )
    actor = serializers.CharField(
        required=False,
        max_length=NAME_MAX_LENGTH,
        help_text="Who caused them, exactly: `user:12`, `worker:3`, `system`, `task:<name>`.",
    )
    occurred_after = AwareDateTimeField(
        required=False, help_text="Events at or after this instant (ISO 8601 with its offset)."
    )
    occurred_before = AwareDateTimeField(
        required=False, help_text="Events before this instant (ISO 8601 with its offset)."
    )
    tenant = WholeNumberField(
        required=False, min_value=1, help_text="Platform admins: only this tenant's events."
    )
    limit = WholeNumberField(
        required=False,
        min_value=1,
        max_value=NewestFirstCursorPagination.max_page_size,
        help_text=f"Events per page (default {NewestFirstCursorPagination.page_size}).",
    )

    def validate_type(self, value: str) -> list[str]:
        types = list(dict.fromkeys(part.strip() for part in value.split(",") if part.strip()))
        if not types:
            raise serializers.ValidationError("Name at least one event type.")
        if len(types) > TYPES_MAX:
            raise serializers.ValidationError(f"At most {TYPES_MAX} event types.")
        if any(len(name) > NAME_MAX_LENGTH for name in types):
            raise serializers.ValidationError(f"An event type is at most {NAME_MAX_LENGTH} long.")
        return types

    def validate(self, attrs):
        if "aggregate_id" in attrs and "aggregate_type" not in attrs:
            raise serializers.ValidationError(
                {"aggregate_id": ["Give aggregate_type with aggregate_id."]}
            )
        check_window(attrs, "occurred_after", "occurred_before")
        return attrs

    def as_selector_filters(self) -> dict:
        data = self.validated_data
        return {
            "tenant_id": data.get("tenant"),
            "types": data.get("type"),
            "aggregate_type": data.get("aggregate_type"),
            "aggregate_id": data.get("aggregate_id"),
            "actor": data.get("actor"),
            "occurred_after": data.get("occurred_after"),
            "occurred_before": data.get("occurred_before"),
        }


class NewestEventsFirstPagination(NewestFirstCursorPagination):
    """The trail by id, newest first: ids are unique, so a cursor is an id alone (no offset
    among equal positions) and each page is a range of the indexes ending in id."""

    ordering = ("-id",)

    def position_valid(self, position: str) -> bool:
        # Compared with a bigint column, and written by the API in ASCII digits: str.isdigit()
        # alone also takes a superscript two, which int() refuses, and the digits of other
        # scripts, which no cursor of ours holds.
        return position.isascii() and position.isdigit() and int(position) < 2**63


# --- output -------------------------------------------------------------------------------


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """An event's payload: always a JSON object (a CHECK constraint keeps it so)."""


class AggregateOutput(serializers.Serializer):
    type = serializers.CharField(source="aggregate_type", read_only=True)
    id = serializers.CharField(source="aggregate_id", read_only=True)


class EventOutput(serializers.ModelSerializer):
    aggregate = AggregateOutput(source="*", read_only=True, help_text="What it happened to.")
    actor = serializers.CharField(
        read_only=True, help_text="`user:<id>`, `worker:<id>`, `system` or `task:<name>`."
    )
    correlation_id = serializers.CharField(
        read_only=True, help_text="The request's or the task's that recorded it (may be blank)."
    )
    payload = JSONObjectField(read_only=True)
    tenant = serializers.IntegerField(
        source="tenant_id",
        allow_null=True,
        read_only=True,
        help_text="The tenant's id; null for the platform's own events (platform admins).",
    )

    class Meta:
        model = Event
        fields = (
            "id",
            "type",
            "aggregate",
            "actor",
            "correlation_id",
            "occurred_at",
            "payload",
            "tenant",
        )
        read_only_fields = fields


# --- the view -----------------------------------------------------------------------------


class EventsApi(GenericAPIView):
    permission_classes = [WiredByTheUrl]
    pagination_class = NewestEventsFirstPagination
    serializer_class = EventOutput

    @extend_schema(
        operation_id="events_list",
        summary="The tenant's events, newest first",
        description=(
            "The audit trail: every domain event recorded with the change that caused it. "
            "A manager reads their tenant's; a platform admin every tenant's and the "
            "platform's own (no tenant), `tenant` narrowing them to one. Another tenant's "
            "events are never listed: a filter that names them finds nothing."
        ),
        parameters=[EventListFilters],
        responses={
            200: EventOutput(many=True),
            400: error_response("A bad filter (`invalid`) or cursor (`invalid_cursor`)."),
        },
    )
    def get(self, request):
        filters = EventListFilters(data=query_values(request))
        filters.is_valid(raise_exception=True)
        events = event_list(
            caller_tenant_id=request.user.tenant_id,
            platform_admin=request.user.is_platform_admin,
            **filters.as_selector_filters(),
        )
        page = self.paginate_queryset(events)
        return self.get_paginated_response(EventOutput(page, many=True).data)
