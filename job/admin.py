"""Jobs in the operators' console: find the stuck and the failed, cancel through the service.

Jobs change only through ``job.services`` (which records their events): the pages are
read-only and the one change offered, cancelling, is an action that calls ``job_cancel``.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

from common.admin import ReadOnlyAdmin, age, age_filter, pretty_json
from common.errors import DomainError
from job.models import Job
from job.services import job_cancel


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = (
        "id",
        "automation",
        "tenant",
        "status",
        "attempt",
        "failure_reason",
        "created_at",
        "waited",
        "finished_at",
    )
    list_filter = ("status", age_filter("created_at"), "automation", "tenant", "failure_reason")
    list_select_related = ("automation", "tenant")
    ordering = ("-created_at", "-id")
    # Counting a long history on every page is slow; the pages do not need it.
    show_full_result_count = False
    actions = ("cancel",)
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "tenant",
                    "automation",
                    "requested_by",
                    "status",
                    "attempt",
                    "events",
                )
            },
        ),
        ("Request", {"fields": ("params_json", "idempotency_key")}),
        (
            "Execution",
            {
                "fields": (
                    "created_at",
                    "started_at",
                    "last_heartbeat_at",
                    "lease_expires_at",
                    "cancel_requested_at",
                    "finished_at",
                    "progress_json",
                )
            },
        ),
        (
            "Outcome",
            {
                "fields": (
                    "failure_reason",
                    "error",
                    "exit_code",
                    "result_json",
                    "output_tail",
                )
            },
        ),
    )
    readonly_fields = (
        "events",
        "id",
        "tenant",
        "automation",
        "requested_by",
        "status",
        "attempt",
        "params_json",
        "idempotency_key",
        "created_at",
        "started_at",
        "last_heartbeat_at",
        "lease_expires_at",
        "cancel_requested_at",
        "finished_at",
        "progress_json",
        "failure_reason",
        "error",
        "exit_code",
        "result_json",
        "output_tail",
    )

    @admin.display(description="age")
    def waited(self, job: Job) -> str:
        return age(job.created_at)

    @admin.display(description="events")
    def events(self, job: Job) -> str:
        """The job's trail, in the events' list."""
        url = reverse("admin:outbox_event_changelist")
        query = urlencode({"aggregate_type": "Job", "q": str(job.pk)})
        return format_html('<a href="{}?{}">its events</a>', url, query)

    @admin.display(description="params")
    def params_json(self, job: Job) -> str:
        return pretty_json(job.params)

    @admin.display(description="progress")
    def progress_json(self, job: Job) -> str:
        return pretty_json(job.progress)

    @admin.display(description="result")
    def result_json(self, job: Job) -> str:
        return pretty_json(job.result)

    def has_cancel_permission(self, request) -> bool:
        return self.may_operate(request)

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel(self, request, queryset) -> None:
        """A pending job is canceled at once; a running one's worker is asked to stop."""
        canceled = asked = 0
        for job_id, tenant_id in queryset.values_list("pk", "tenant_id"):
            try:
                done = job_cancel(tenant=tenant_id, job_id=job_id, actor=request.user)
            except DomainError as refusal:
                self.message_user(request, f"Job {job_id}: {refusal.message}", messages.WARNING)
                continue
            if done.status == Job.Status.CANCELED:
                canceled += 1
            else:
                asked += 1
        if canceled:
            self.message_user(request, f"{canceled} job(s) canceled.", messages.SUCCESS)
        if asked:
            self.message_user(
                request,
                f"{asked} running job(s) asked to stop: each is canceled when its worker stops it.",
                messages.SUCCESS,
            )
