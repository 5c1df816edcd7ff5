"""The relay's schedules in the operators' console: when each periodic task is next due."""

from __future__ import annotations

from django.contrib import admin, messages

from common.admin import ReadOnlyAdmin
from relay.models import RelaySchedule
from relay.schedules import schedules_make_due


@admin.register(RelaySchedule)
class RelayScheduleAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = ("name", "next_due_at", "last_run_id")
    search_fields = ("name",)
    ordering = ("name",)
    readonly_fields = ("name", "next_due_at", "last_run_id")
    fields = readonly_fields
    actions = ("make_due",)

    def has_make_due_permission(self, request) -> bool:
        return self.may_operate(request)

    @admin.action(description="Run now (due at the relay's next sweep)", permissions=["make_due"])
    def make_due(self, request, queryset) -> None:
        count = schedules_make_due(names=list(queryset.values_list("name", flat=True)))
        self.message_user(request, f"{count} schedule(s) due now.", messages.SUCCESS)
