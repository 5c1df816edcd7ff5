"""The messaging half in the operators' console: outbox rows, task runs, the events trail.

All of it is written by services only, so the pages are read-only; the changes an
operator may make are actions calling ``outbox.operations`` (send again, requeue).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import admin, messages
from django.db.models import Q
from django.utils import timezone
from django.utils.html import format_html

from common.admin import (
    ChoiceFilter,
    OneJobFilter,
    ReadOnlyAdmin,
    act_on_each,
    age,
    age_filter,
    change_link,
    duration,
    moment,
    shown_at,
    shown_json,
    shown_text,
)
from outbox.catalog import get_catalog
from outbox.console import job_run_ids, run_job_ids, run_payloads
from outbox.models import Event, OutboxMessage, PlatformOutboxMessage, TaskRun
from outbox.operations import outbox_send_again, task_run_requeue

# What a task's runs did beyond their status, by task: the apps above the outbox register
# theirs (``webhook.admin``: a webhook.deliver run succeeds whatever the receiver answered).
# Each takes the runs and their payloads (by run id) and gives each run's outcome as HTML.
RunOutcomes = Callable[[list[TaskRun], dict[str, dict]], dict[str, str]]
TASK_RUN_OUTCOMES: dict[str, RunOutcomes] = {}


def task_run_outcome(task: str) -> Callable[[RunOutcomes], RunOutcomes]:
    def register(shown: RunOutcomes) -> RunOutcomes:
        TASK_RUN_OUTCOMES[task] = shown
        return shown

    return register


def _outcomes_of(runs: list[TaskRun]) -> dict[str, str]:
    by_task: dict[str, list[TaskRun]] = {}
    for run in runs:
        if run.task in TASK_RUN_OUTCOMES:
            by_task.setdefault(run.task, []).append(run)
    if not by_task:
        return {}
    payloads = run_payloads([run.run_id for group in by_task.values() for run in group])
    shown: dict[str, str] = {}
    for task, group in by_task.items():
        shown.update(TASK_RUN_OUTCOMES[task](group, payloads))
    return shown


class PendingFilter(ChoiceFilter):
    title = "delivery"
    parameter_name = "pending"
    conditions = {
        "yes": ("pending", Q(sent_at__isnull=True)),
        "no": ("sent", Q(sent_at__isnull=False)),
    }


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
        "state",
        "attempts",
        "available_shown",
        "waited",
        "sent_shown",
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

    @admin.display(description="status", ordering="sent_at")
    def state(self, row) -> str:
        """Sent, or why it is not yet: due (the relay's next batch takes it), waiting for
        its delay, or backing off after the broker refused it."""
        if row.sent_at is not None:
            return format_html('<span class="state-sent">{}</span>', "sent")
        if row.available_at > timezone.now():
            waits = "backing off" if row.attempts else "delayed"
            return format_html(
                '<span class="state-waiting">{}: due {}</span>', waits, moment(row.available_at)
            )
        return format_html('<span class="state-pending">{}</span>', "pending: due now")

    available_shown = shown_at("available_at", "available at", ordering="available_at")
    sent_shown = shown_at("sent_at", "sent at", ordering="sent_at")

    @admin.display(description="age")
    def waited(self, row) -> str:
        return age(row.created_at)

    envelope_json = shown_json("envelope", "envelope")

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


# Characters of a run's error shown in the list (its page shows all of it).
ERROR_LINE_CHARS = 300


class RunJobFilter(OneJobFilter):
    """The runs a job caused."""

    def of_job(self, queryset, job_id: int):
        return queryset.filter(run_id__in=job_run_ids(job_id))


@admin.register(TaskRun)
class TaskRunAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    # The queue is the task's (and a filter), the tenant and the creation are on the run's
    # page: at 1,400 px the width goes to the id, the outcome and the error, none cut.
    list_display = ("run_id", "task", "outcome", "receives", "updated_shown", "error_line")
    list_filter = (
        TaskFilter,
        "status",
        "queue",
        age_filter("updated_at", "last change"),
        RunJobFilter,
    )
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
        "job",
        "status",
        "outcome",
        "receive_count",
        "correlation_id",
        "created_shown",
        "updated_shown",
        "started_shown",
        "finished_shown",
        "took",
        "lease_holder",
        "lease_shown",
        "last_error_text",
    )
    fields = readonly_fields

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # The page's outcomes in a few queries, not a few a row.
        shown = _outcomes_of(list(changelist.result_list))
        for run in changelist.result_list:
            run.outcome_shown = shown.get(str(run.run_id))
        return changelist

    @admin.display(description="status / outcome", ordering="status")
    def outcome(self, run: TaskRun) -> str:
        """The run's status; for a task whose runs succeed whatever came of their work (a
        webhook attempt), what came of it instead."""
        if not hasattr(run, "outcome_shown"):
            run.outcome_shown = _outcomes_of([run]).get(str(run.run_id))
        if run.outcome_shown is not None and run.status == TaskRun.Status.SUCCEEDED:
            return run.outcome_shown
        return format_html('<span class="run-{}">{}</span>', run.status, run.status)

    @admin.display(description="receives", ordering="receive_count")
    def receives(self, run: TaskRun) -> int:
        return run.receive_count

    @admin.display(description="job")
    def job(self, run: TaskRun) -> str:
        job_id = run_job_ids([run.run_id]).get(str(run.run_id))
        return change_link("job_job", job_id, f"job {job_id}")

    created_shown = shown_at("created_at", "created", ordering="created_at")
    updated_shown = shown_at("updated_at", "last change", ordering="updated_at")
    started_shown = shown_at("started_at", "started")
    finished_shown = shown_at("finished_at", "finished")

    @admin.display(description="took")
    def took(self, run: TaskRun) -> str:
        return duration(run.started_at, run.finished_at)

    lease_shown = shown_at("lease_expires_at", "lease expires")
    last_error_text = shown_text("last_error", "last error")

    @admin.display(description="last error")
    def error_line(self, run: TaskRun) -> str:
        """The error's first line, whole (the run's page has the traceback)."""
        first = run.last_error.strip().splitlines()[:1]
        if not first:
            return ""
        line = first[0] if len(first[0]) <= ERROR_LINE_CHARS else f"{first[0][:ERROR_LINE_CHARS]}…"
        return format_html('<span class="error-line">{}</span>', line)

    def has_requeue_permission(self, request) -> bool:
        return self.may_operate(request)

    @admin.action(description="Requeue the selected failed runs", permissions=["requeue"])
    def requeue(self, request, queryset) -> None:
        act_on_each(
            self,
            request,
            queryset.values_list("run_id", flat=True),
            lambda run_id: task_run_requeue(run_id=run_id),
            done_message="{count} run(s) requeued: the relay sends them next.",
            refusal_level=messages.WARNING,
            named=lambda run_id: f"Run {run_id}",
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
    fields = (*list_display, "payload_json")
    readonly_fields = fields

    payload_json = shown_json("payload", "payload")
