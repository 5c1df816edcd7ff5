"""Jobs in the operators' console: find the stuck and the failed, cancel or re-run them
through the services.

Jobs change only through ``job.services`` (which records their events): the pages are
read-only and the two operations offered go through the services the API calls: cancelling
(``job_cancel``) and running a finished job again as a new job (``job_rerun``), each as an
action on the list or a button of a job's page. A job's page links to what it caused (its
events, its task runs, its webhook deliveries, its re-runs) and to what started it (a
schedule's due time, the job it re-runs); the modules above the jobs add their links
(``job_page_links``). While a job runs, its page shows its output as its worker sends it:
the page's script (``job/static/job/live_output.js``) reads it from ``output_view``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ActionForm
from django.contrib.admin.utils import flatten_fieldsets, unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseNotAllowed, HttpResponseRedirect, JsonResponse
from django.shortcuts import get_object_or_404
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode

from common.admin import (
    ReadOnlyAdmin,
    age,
    age_filter,
    duration,
    moment,
    pretty_json,
    shown_at,
    shown_json,
    shown_text,
)
from common.api import error_body
from common.errors import DomainError
from job.models import Job
from job.selectors import job_output_last, job_output_page, output_page_public
from job.services import job_cancel, job_rerun
from outbox.console import job_correlation_id

# Links of a job's page given by the modules above the jobs (webhook deliveries, the
# schedule that started it): each takes the job's id and gives HTML links.
JobLinks = Callable[[int], list[str]]
JOB_PAGE_LINKS: list[JobLinks] = []


# How much of a job's stored output its page shows: the end of it. It is also the most a
# read of the page's script answers, and the most the page keeps as more comes.
ADMIN_OUTPUT_CHARS = 20_000


def job_page_links(links: JobLinks) -> JobLinks:
    JOB_PAGE_LINKS.append(links)
    return links


def _change_url(name: str, pk) -> str:
    return reverse(f"admin:{name}_change", args=[pk])


def _json_error(status: int, code: str, message: str, details=None) -> JsonResponse:
    return JsonResponse(error_body(code, message, details), status=status)


class JobActionForm(ActionForm):
    """The list's action form, with a key of its own each time it is shown: a form sent
    twice (a double click, the browser's back and send again) runs its jobs again once."""

    submission = forms.CharField(
        widget=forms.HiddenInput, required=False, initial=lambda: uuid.uuid4().hex
    )


def _submission(request) -> str | None:
    """The key of the form that sent ``request`` (a page's Run again, the list's action)."""
    key = request.POST.get("submission", "")
    return key if 0 < len(key) <= 64 and key.isalnum() else None


@admin.register(Job)
class JobAdmin(ReadOnlyAdmin, admin.ModelAdmin):
    list_display = (
        "id",
        "automation",
        "tenant",
        "status_shown",
        "attempt",
        "failure_reason",
        "created_shown",
        "waited",
        "finished_shown",
    )
    list_filter = ("status", age_filter("created_at"), "automation", "tenant", "failure_reason")
    list_select_related = ("automation", "tenant")
    ordering = ("-created_at", "-id")
    # Counting a long history on every page is slow; the pages do not need it.
    show_full_result_count = False
    actions = ("cancel", "rerun")
    action_form = JobActionForm
    change_form_template = "admin/job/job/change_form.html"
    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "status_shown",
                    "tenant_link",
                    "automation_link",
                    "requested_by",
                    "started_by",
                    "rerun_of_link",
                    "attempt",
                    "correlation",
                    "links",
                )
            },
        ),
        ("Request", {"fields": ("params_json", "idempotency_key")}),
        (
            "Execution",
            {
                "fields": (
                    "created_shown",
                    "started_shown",
                    "last_heartbeat_shown",
                    "lease_expires_shown",
                    "cancel_requested_shown",
                    "finished_shown",
                    "took",
                    "claim_token",
                    "progress_json",
                )
            },
        ),
        (
            "Outcome",
            {
                "fields": (
                    "failure_reason",
                    "error_text",
                    "exit_code",
                    "result_json",
                    "output_text",
                )
            },
        ),
        ("Output", {"fields": ("stored_output",)}),
    )
    # Every field of the page is shown, none edited (a job changes through its services).
    readonly_fields = flatten_fieldsets(fieldsets)

    def get_urls(self):
        cancel = path(
            "<int:object_id>/cancel/",
            self.admin_site.admin_view(self.cancel_view),
            name="job_job_cancel",
        )
        rerun = path(
            "<int:object_id>/rerun/",
            self.admin_site.admin_view(self.rerun_view),
            name="job_job_rerun",
        )
        output = path(
            "<path:object_id>/output/",
            self.admin_site.admin_view(self.output_view),
            name="job_job_output",
        )
        return [cancel, rerun, output, *super().get_urls()]

    # --- the list -----------------------------------------------------------------------

    @admin.display(description="status", ordering="status")
    def status_shown(self, job: Job) -> str:
        """A running job asked to stop says so: it stays running until its worker stops it."""
        if job.status == Job.Status.RUNNING and job.cancel_requested_at is not None:
            return format_html(
                '<span class="job-canceling">running, cancel requested {}</span>',
                moment(job.cancel_requested_at),
            )
        return format_html('<span class="job-{}">{}</span>', job.status, job.status)

    @admin.display(description="age")
    def waited(self, job: Job) -> str:
        return age(job.created_at)

    created_shown = shown_at("created_at", "created", ordering="created_at")
    finished_shown = shown_at("finished_at", "finished", ordering="finished_at")

    # --- the page -----------------------------------------------------------------------

    @admin.display(description="tenant")
    def tenant_link(self, job: Job) -> str:
        url = _change_url("identity_tenant", job.tenant_id)
        return format_html('<a href="{}">{}</a> (id {})', url, job.tenant, job.tenant_id)

    @admin.display(description="automation")
    def automation_link(self, job: Job) -> str:
        url = _change_url("automation_automation", job.automation_id)
        return format_html('<a href="{}">{}</a> (id {})', url, job.automation, job.automation_id)

    @admin.display(description="started by")
    def started_by(self, job: Job) -> str:
        """Who asked for it, or what started it (a schedule's due time)."""
        if job.triggered_by:
            return pretty_json(job.triggered_by)
        return "a request" if job.requested_by_id else "—"

    @admin.display(description="re-run of")
    def rerun_of_link(self, job: Job) -> str:
        if job.rerun_of_id is None:
            return "—"
        url = _change_url("job_job", job.rerun_of_id)
        return format_html('<a href="{}">job {}</a>', url, job.rerun_of_id)

    @admin.display(description="correlation id")
    def correlation(self, job: Job) -> str:
        """The id of the request that created it: its log lines and messages carry it (a
        job older than its column: its first event's)."""
        correlation = job.correlation_id or job_correlation_id(job.pk)
        if not correlation:
            return "—"
        url = reverse("admin:outbox_taskrun_changelist")
        return format_html(
            '<code>{}</code> (<a href="{}?{}">its task runs</a>)',
            correlation,
            url,
            urlencode({"q": correlation}),
        )

    @admin.display(description="links")
    def links(self, job: Job) -> str:
        """What the job caused and what started it."""
        events = reverse("admin:outbox_event_changelist")
        runs = reverse("admin:outbox_taskrun_changelist")
        own = [
            format_html(
                '<a href="{}?{}">its events</a>',
                events,
                urlencode({"aggregate_type": "Job", "q": str(job.pk)}),
            ),
            format_html('<a href="{}?{}">its task runs</a>', runs, urlencode({"job": job.pk})),
            format_html(
                '<a href="{}?{}">its re-runs</a>',
                reverse("admin:job_job_changelist"),
                urlencode({"rerun_of": job.pk}),
            ),
        ]
        given = [link for links in JOB_PAGE_LINKS for link in links(job.pk)]
        return format_html_join(" · ", "{}", ((link,) for link in [*own, *given]))

    started_shown = shown_at("started_at", "started")
    last_heartbeat_shown = shown_at("last_heartbeat_at", "last heartbeat")
    lease_expires_shown = shown_at("lease_expires_at", "lease expires")
    cancel_requested_shown = shown_at("cancel_requested_at", "cancel requested")

    @admin.display(description="duration")
    def took(self, job: Job) -> str:
        """From its start to its end; a running job's so far."""
        if job.started_at is None:
            return "—"
        if job.finished_at is None:
            return f"{duration(job.started_at, timezone.now())} so far"
        return duration(job.started_at, job.finished_at)

    @admin.display(description="output sent while running")
    def stored_output(self, job: Job) -> str:
        """The end of the log the worker sent while the command ran, the part before it
        said in a line (all of it is read through GET /jobs/{id}/output). Until the job
        ends and all of it is shown, the page's script adds what comes next (the
        ``data-output-*`` attributes: where the text shown starts and ends, where to ask)."""
        page = job_output_last(job=job, chars=ADMIN_OUTPUT_CHARS)
        if not page.next_offset and page.finished:
            return "—"
        # Where the text shown starts: past ``page.offset`` when older chunks are gone.
        start = page.next_offset - len(page.text)
        marker = (
            format_html(
                '<span class="output-before">[... {} characters before ...]\n</span>', start
            )
            if start
            else ""
        )
        if page.finished:
            return format_html('<pre class="output-text">{}{}</pre>', marker, page.text)
        return format_html(
            '<pre class="output-text output-live" id="job-output" data-output-url="{}"'
            ' data-output-from="{}" data-output-offset="{}" data-output-chars="{}">{}{}</pre>'
            '<p class="output-live-status" id="job-output-status">{}</p>',
            reverse("admin:job_job_output", args=[job.pk]),
            start,
            page.next_offset,
            ADMIN_OUTPUT_CHARS,
            marker,
            page.text,
            f"Job {job.status}: its output shows here as its worker sends it.",
        )

    error_text = shown_text("error", "error")
    output_text = shown_text("output_tail", "output tail", css="output-text")
    params_json = shown_json("params", "params")
    progress_json = shown_json("progress", "progress")
    result_json = shown_json("result", "result")

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        context["cancel_offered"] = (
            obj is not None
            and not obj.is_finished
            and not obj.cancel_requested
            and self.has_cancel_permission(request)
        )
        context["rerun_offered"] = (
            obj is not None and obj.is_finished and self.has_rerun_permission(request)
        )
        # The page's Run again form sends it: sent twice, the one new job is shown again.
        context["rerun_submission"] = uuid.uuid4().hex
        return super().render_change_form(request, context, add, change, form_url, obj)

    # --- its output, live -------------------------------------------------------------

    def output_view(self, request, object_id: str):
        """A page of the job's output from ``?offset=`` as JSON, at most ADMIN_OUTPUT_CHARS
        characters: what the script of a running job's page asks for every second. The
        API's GET /jobs/{id}/output is for a tenant's people; this is the staff's."""
        if request.method != "GET":
            response = _json_error(405, "method_not_allowed", "A job's output is only read.")
            response["Allow"] = "GET"
            return response
        if not self.has_view_permission(request):
            return _json_error(403, "permission_denied", "You may not look at jobs.")
        offset = request.GET.get("offset", "0")
        # ASCII digits only (str.isdigit() also takes "²", which int() refuses), at most 18
        # of them: a bigint, the offsets' column, holds any such number.
        if not (offset.isascii() and offset.isdigit() and len(offset) < 19):
            return _json_error(
                400,
                "invalid",
                "The input is invalid.",
                {"offset": ["A whole number, 0 or more: the next_offset of the last read."]},
            )
        job = self.get_object(request, unquote(object_id))
        if job is None:
            return _json_error(404, "job_not_found", "There is no such job.")
        if not self.has_view_permission(request, job):
            return _json_error(403, "permission_denied", "You may not look at this job.")
        page = job_output_page(job=job, offset=int(offset), limit=ADMIN_OUTPUT_CHARS)
        return JsonResponse(output_page_public(job, page))

    # --- cancelling ---------------------------------------------------------------------

    def has_cancel_permission(self, request) -> bool:
        return self.may_operate(request)

    def cancel_view(self, request, object_id: int):
        """The Cancel button of a job's page (a POST), through the same service."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        job = get_object_or_404(Job, pk=object_id)
        self._cancel_each(request, [(job.pk, job.tenant_id)])
        return HttpResponseRedirect(_change_url("job_job", job.pk))

    @admin.action(description="Cancel the selected jobs", permissions=["cancel"])
    def cancel(self, request, queryset) -> None:
        """A pending job is canceled at once; a running one's worker is asked to stop."""
        self._cancel_each(request, queryset.values_list("pk", "tenant_id"))

    def _cancel_each(self, request, jobs) -> None:
        canceled = asked = 0
        for job_id, tenant_id in jobs:
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

    # --- running again ------------------------------------------------------------------

    def has_rerun_permission(self, request) -> bool:
        return self.may_operate(request)

    def rerun_view(self, request, object_id: int):
        """The Run again button of a job's page (a POST), through the same service; the
        page of the new job follows."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if not self.has_rerun_permission(request):
            raise PermissionDenied
        job = get_object_or_404(Job.objects.select_related("tenant"), pk=object_id)
        created = self._rerun_each(request, [job])
        return HttpResponseRedirect(_change_url("job_job", created[0] if created else job.pk))

    @admin.action(description="Run the selected finished jobs again", permissions=["rerun"])
    def rerun(self, request, queryset) -> None:
        """Each finished job becomes a new pending job of its automation with its params,
        requested by the operator; an unfinished one is refused."""
        self._rerun_each(request, queryset.select_related("tenant").order_by("pk"))

    def _rerun_each(self, request, jobs) -> list[int]:
        """Each job run again with the idempotency key of the form that asked (one a job):
        the same form sent again finds the jobs it created and creates none."""
        submission = _submission(request)
        created, earlier = [], []
        for job in jobs:
            key = f"admin-rerun:{submission}:{job.pk}" if submission else None
            try:
                rerun, new = job_rerun(
                    tenant=job.tenant, job_id=job.pk, requested_by=request.user, idempotency_key=key
                )
            except DomainError as refusal:
                self.message_user(request, f"Job {job.pk}: {refusal.message}", messages.WARNING)
                continue
            (created if new else earlier).append(rerun.pk)
        if created:
            self.message_user(
                request,
                f"{len(created)} job(s) run again, as job(s) "
                f"{', '.join(str(pk) for pk in created)}.",
                messages.SUCCESS,
            )
        if earlier:
            self.message_user(
                request,
                "This form was sent before: its job(s) "
                f"{', '.join(str(pk) for pk in earlier)} were created then, none again.",
                messages.INFO,
            )
        return created + earlier
