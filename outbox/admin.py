"""The messaging half in the operators' console: outbox rows, task runs, the events trail.

All of it is written by services only, so the pages are read-only; the changes an
operator may make are actions calling ``outbox.operations`` (send again, requeue).
"""

from __future__ import annotations

from django.contrib import admin, messages

from common.admin import ReadOnlyAdmin, age, age_filter, pretty_json
from common.errors import DomainError
from outbox.catalog import get_catalog
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.operations import outbox_send_again, task_run_requeue


class PendingFilter(admin.SimpleListFilter):
    title = "delivery"
    parameter_name = "pending"

    def lookups(self, request, model_admin):
        return [("yes", "pending"), ("no", "sent")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(sent_at__isnull=True)
        if self.value() == "no":
            return queryset.filter(sent_at__isnull=False)
        return queryset


class TaskFilter(admin.SimpleListFilter):
    """The catalog's tasks (not a DISTINCT over a table that keeps every run)."""

    title = "task"
    parameter_name = "task"

    def lookups(self, request, model_admin):
        return [(name, name) for name in sorted(get_catalog().tasks)]

    def queryset(self, request, queryset):
        return queryset.filter(task=self.value()) if self.value() else queryset


class OutboxMessageAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = (
        "id",
        "task",
        "queue",
        "destination",
        "pending",
        "attempts",
        "available_at",
        "waited",
        "sent_at",
    )
    list_filter = (PendingFilter, "queue", age_filter("created_at"))
    search_fields = ("=run_id",)
    ordering = ("-id",)
    show_full_result_count = False
    actions = ("send_again",)
    fields = (
        "id",
        "run_id",
        "queue",
        "available_at",
        "sent_at",
        "attempts",
        "created_at",
        "envelope_json",
    )
    readonly_fields = fields

    @admin.display(description="task")
    def task(self, row) -> str:
        return str(row.envelope.get("task") or row.envelope.get("event") or "")

    @admin.display(description="destination")
    def destination(self, row) -> str:
        return str(row.envelope.get("destination", ""))

    @admin.display(description="pending", boolean=True, ordering="sent_at")
    def pending(self, row) -> bool:
        return row.sent_at is None

    @admin.display(description="age")
    def waited(self, row) -> str:
        return age(row.created_at)

    @admin.display(description="envelope")
    def envelope_json(self, row) -> str:
        return pretty_json(row.envelope)

    def has_send_again_permission(self, request) -> bool:
        return self.may_operate(request)

    @admin.action(description="Send again (due now)", permissions=["send_again"])
    def send_again(self, request, queryset) -> None:
        count = outbox_send_again(model=self.model, ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(
            request, f"{count} message(s) due now: the relay sends them next.", messages.SUCCESS
        )


@admin.register(OutboxMessage)
class TenantOutboxMessageAdmin(OutboxMessageAdmin):
    list_display = (*OutboxMessageAdmin.list_display, "tenant")
    list_select_related = ("tenant",)
    fields = (*OutboxMessageAdmin.fields, "tenant")
    readonly_fields = fields


@admin.register(PlatformOutboxMessage)
class PlatformOutboxMessageAdmin(OutboxMessageAdmin):
    pass


@admin.register(TaskRun)
class TaskRunAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = (
        "run_id",
        "task",
        "status",
        "queue",
        "receive_count",
        "tenant",
        "created_at",
        "updated_at",
        "error_line",
    )
    list_filter = (TaskFilter, "status", "queue", age_filter("updated_at", "last change"))
    list_select_related = ("tenant",)
    search_fields = ("=run_id", "=correlation_id")
    ordering = ("-created_at",)
    show_full_result_count = False
    actions = ("requeue",)
    readonly_fields = (
        "run_id",
        "task",
        "event",
        "queue",
        "tenant",
        "status",
        "receive_count",
        "correlation_id",
        "created_at",
        "updated_at",
        "started_at",
        "finished_at",
        "lease_holder",
        "lease_expires_at",
        "last_error",
    )
    fields = readonly_fields

    @admin.display(description="last error")
    def error_line(self, run: TaskRun) -> str:
        first = run.last_error.strip().splitlines()[:1]
        return first[0][:120] if first else ""

    def has_requeue_permission(self, request) -> bool:
        return self.may_operate(request)

    @admin.action(description="Requeue the selected failed runs", permissions=["requeue"])
    def requeue(self, request, queryset) -> None:
        count = 0
        for run_id in queryset.values_list("run_id", flat=True):
            try:
                task_run_requeue(run_id=run_id)
            except DomainError as refusal:
                self.message_user(request, f"Run {run_id}: {refusal.message}", messages.WARNING)
            else:
                count += 1
        if count:
            self.message_user(
                request, f"{count} run(s) requeued: the relay sends them next.", messages.SUCCESS
            )


@admin.register(Event)
class EventAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    """The permanent trail of domain events: read-only."""

    list_display = (
        "id",
        "type",
        "aggregate_type",
        "aggregate_id",
        "tenant",
        "actor",
        "correlation_id",
        "occurred_at",
    )
    list_filter = ("aggregate_type", "type")
    list_select_related = ("tenant",)
    search_fields = ("=aggregate_id", "=correlation_id", "=actor")
    ordering = ("-id",)
    show_full_result_count = False
    fields = (
        "id",
        "type",
        "aggregate_type",
        "aggregate_id",
        "tenant",
        "actor",
        "correlation_id",
        "occurred_at",
        "payload_json",
    )
    readonly_fields = fields

    @admin.display(description="payload")
    def payload_json(self, event: Event) -> str:
        return pretty_json(event.payload)
