"""Schedules in the Django admin, saved and moved through the same services as the API."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from common.admin import (
    ChoiceFilter,
    DeactivatableAdmin,
    EditedAsShownForm,
    StorableJSONField,
    act_on_each,
    adopt,
    moment,
    shown_at,
)
from common.errors import DomainError
from identity.selectors import tenant_list
from job.admin import job_page_links
from job.services import job_params_check
from schedule.console import job_origin
from schedule.models import Schedule
from schedule.selectors import schedule_runs
from schedule.services import (
    check_fields,
    schedule_create,
    schedule_deactivate,
    schedule_pause,
    schedule_resume,
    schedule_update,
)

EDITABLE = ("name", "cron", "timezone", "params", "misfire")
RECENT_RUNS = 20


class ScheduleAdminForm(EditedAsShownForm):
    params = StorableJSONField(required=False, initial=dict)

    class Meta:
        model = Schedule
        fields = ("tenant", "automation", *EDITABLE)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "tenant" in self.fields:
            # A schedule is added to an active tenant only (a deactivation ends its schedules).
            self.fields["tenant"].queryset = tenant_list(is_active=True)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("params") is None:
            cleaned["params"] = {}
        # The API's checks, with its messages, shown on the fields they are about.
        try:
            check_fields({key: cleaned[key] for key in EDITABLE if key in cleaned})
            automation = cleaned.get("automation") or getattr(self.instance, "automation", None)
            if automation is not None:
                job_params_check(
                    cleaned["params"], schema=automation.params_schema, automation_id=automation.pk
                )
        except DomainError as refusal:
            for field, problems in (refusal.details or {"__all__": [refusal.message]}).items():
                target = field if field in self.fields else None
                for problem in problems if isinstance(problems, list) else [problems]:
                    self.add_error(target, str(problem))
        return cleaned


class StateFilter(ChoiceFilter):
    """Running, paused (the console's "schedules paused"), or deactivated."""

    title = "state"
    parameter_name = "state"
    conditions = {
        "active": ("running", Q(is_active=True, paused_at__isnull=True)),
        "paused": ("paused", Q(is_active=True, paused_at__isnull=False)),
        "deactivated": ("deactivated", Q(is_active=False)),
    }


@admin.register(Schedule)
class ScheduleAdmin(DeactivatableAdmin, admin.ModelAdmin):
    form = ScheduleAdminForm
    list_display = (
        "name",
        "tenant",
        "automation",
        "cron",
        "timezone",
        "status",
        "paused_reason",
        "next_run_shown",
        "last_run_shown",
    )
    list_filter = (StateFilter, "is_active", "misfire")
    search_fields = ("name", "cron")
    list_select_related = ("tenant", "automation")
    readonly_fields = (
        "status",
        "next_run_at",
        "last_run_at",
        "paused_at",
        "paused_reason",
        "deactivated_at",
        "deactivated_reason",
        "created_by",
        "created_at",
        "updated_at",
        "recent_runs",
    )
    actions = ("pause_selected", "resume_selected", "deactivate_selected")

    @admin.display(description="Recent runs (due time: job)")
    def recent_runs(self, schedule: Schedule) -> str:
        # The latest few only: an every-minute schedule has hundreds of thousands a year.
        runs = schedule_runs(schedule=schedule, limit=RECENT_RUNS) if schedule.pk else []
        return (
            format_html_join(
                mark_safe("<br>"),
                '{}: job {} (<a href="{}">its page</a>)',
                (
                    (
                        run.due_at.isoformat(),
                        run.job_id,
                        reverse("admin:job_job_change", args=[run.job_id]),
                    )
                    for run in runs
                ),
            )
            or "-"
        )

    next_run_shown = shown_at("next_run_at", "next run", ordering="next_run_at")
    last_run_shown = shown_at("last_run_at", "last run", ordering="last_run_at")

    def get_readonly_fields(self, request, obj=None):
        fixed = ("tenant", "automation") if obj is not None else ()
        return (*fixed, *self.readonly_fields)

    def save_model(self, request, obj: Schedule, form, change: bool) -> None:
        # The admin already runs this inside one transaction (changeform_view).
        if change:
            data = {field: form.cleaned_data[field] for field in form.changed_data}
            saved = schedule_update(tenant=obj.tenant_id, schedule_id=obj.pk, data=data)
        else:
            saved = schedule_create(
                tenant=obj.tenant,
                actor=request.user,
                automation_id=obj.automation_id,
                name=obj.name,
                cron=obj.cron,
                timezone_name=obj.timezone,
                params=obj.params,
                misfire=obj.misfire,
            )
        adopt(obj, saved)

    def _each(self, request, queryset, service, done: str) -> None:
        act_on_each(
            self,
            request,
            queryset,
            lambda schedule: service(tenant=schedule.tenant_id, schedule_id=schedule.pk),
            done_message=done,
        )

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_selected(self, request, queryset) -> None:
        self._each(request, queryset, schedule_pause, "Paused {count} schedule(s).")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_selected(self, request, queryset) -> None:
        self._each(request, queryset, schedule_resume, "Resumed {count} schedule(s).")

    @admin.action(description="Deactivate selected schedules", permissions=["change"])
    def deactivate_selected(self, request, queryset) -> None:
        self._each(request, queryset, schedule_deactivate, "Deactivated {count} schedule(s).")


@job_page_links
def job_schedule_link(job_id: int) -> list[str]:
    """The job's page links to the schedule whose due time started it."""
    origin = job_origin(job_id)
    if origin is None:
        return []
    url = reverse("admin:schedule_schedule_change", args=[origin.schedule_id])
    return [
        format_html(
            'started by schedule <a href="{}">{}</a> (due {})',
            url,
            origin.schedule_name,
            moment(origin.due_at),
        )
    ]
