"""Webhook endpoints and their deliveries in the Django admin, through the same services as
the API. A secret is shown once, in the message after a creation or a rotation."""

from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

from common.admin import (
    ChoiceFilter,
    EditedAsShownForm,
    NeverDeletedAdmin,
    OneJobFilter,
    act_on_each,
    adopt,
    change_link,
    moment,
    pretty_json,
    shown_at,
    shown_text,
)
from common.errors import DomainError
from identity.selectors import tenant_list
from job.admin import job_page_links
from outbox.admin import task_run_outcome
from outbox.console import event_job_ids, job_event_ids
from webhook.console import deliver_runs_outcomes
from webhook.delivery import delivery_redeliver
from webhook.models import EndpointStatus, WebhookAttempt, WebhookDelivery, WebhookEndpoint
from webhook.services import (
    endpoint_create,
    endpoint_disable,
    endpoint_enable,
    endpoint_limit_check,
    endpoint_rotate_secret,
    endpoint_update,
    validated_event_types,
    validated_url,
)


class EndpointAdminForm(EditedAsShownForm):
    event_types = forms.CharField(help_text="Comma-separated, e.g. JobCompleted, JobFailed.")

    class Meta:
        model = WebhookEndpoint
        fields = ("tenant", "url", "event_types", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if "tenant" in self.fields:
            # An endpoint is added to an active tenant only: a deactivated one has no events.
            self.fields["tenant"].queryset = tenant_list(is_active=True)
        if self.instance.pk:
            self.initial["event_types"] = ", ".join(self.instance.event_types)

    def clean_url(self) -> str:
        return _as_form_error(validated_url, self.cleaned_data["url"])

    def clean_event_types(self) -> list[str]:
        names = [name.strip() for name in self.cleaned_data["event_types"].split(",")]
        return _as_form_error(validated_event_types, [name for name in names if name])

    def clean(self):
        cleaned = super().clean()
        if not self.instance.pk and cleaned.get("tenant") is not None:
            # The tenant's limit, as a form error (the creation checks again, under its lock).
            _as_form_error(lambda tenant: endpoint_limit_check(tenant=tenant), cleaned["tenant"])
        return cleaned


def _as_form_error(check, value):
    try:
        return check(value)
    except DomainError as exc:
        raise forms.ValidationError(exc.message) from None


class EndpointHealthFilter(ChoiceFilter):
    """Active endpoints whose every attempt fails (the console's "endpoints failing")."""

    title = "health"
    parameter_name = "health"
    conditions = {
        "failing": ("failing", Q(status=EndpointStatus.ACTIVE, failing_since__isnull=False)),
        "answering": ("answering", Q(status=EndpointStatus.ACTIVE, failing_since__isnull=True)),
    }


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(NeverDeletedAdmin, admin.ModelAdmin):
    form = EndpointAdminForm
    list_display = ("url", "tenant", "status", "failing_since", "created_at")
    list_filter = ("status", EndpointHealthFilter)
    search_fields = ("url", "description")
    readonly_fields = ("status", "disabled_reason", "disabled_at", "failing_since", "created_at")
    actions = ("rotate_secret", "disable_selected", "enable_selected")

    def get_readonly_fields(self, request, obj=None):
        # A tenant's endpoint stays the tenant's.
        return (*self.readonly_fields, "tenant") if obj else self.readonly_fields

    def save_model(self, request, obj: WebhookEndpoint, form, change: bool) -> None:
        data = form.cleaned_data
        if change:
            changed = {field: data[field] for field in form.changed_data if field != "tenant"}
            saved = endpoint_update(
                tenant=obj.tenant_id, endpoint_id=obj.pk, data=changed, actor=request.user
            )
        else:
            saved = endpoint_create(
                tenant=data["tenant"],
                url=data["url"],
                event_types=data["event_types"],
                description=data.get("description", ""),
                actor=request.user,
            )
            self._show_secret(request, saved)
        adopt(obj, saved)

    def _show_secret(self, request, endpoint: WebhookEndpoint) -> None:
        messages.warning(
            request,
            f"Signing secret of {endpoint.url}: {endpoint.secret} (shown only now).",
        )

    def _each(self, request, queryset, action) -> None:
        act_on_each(self, request, queryset, action, named=lambda endpoint: endpoint.url)

    @admin.action(description="Rotate the signing secret", permissions=["change"])
    def rotate_secret(self, request, queryset) -> None:
        self._each(
            request,
            queryset,
            lambda e: self._show_secret(
                request,
                endpoint_rotate_secret(tenant=e.tenant_id, endpoint_id=e.pk, actor=request.user),
            ),
        )

    @admin.action(description="Disable selected endpoints", permissions=["change"])
    def disable_selected(self, request, queryset) -> None:
        self._each(
            request,
            queryset,
            lambda e: endpoint_disable(
                tenant=e.tenant_id,
                endpoint_id=e.pk,
                actor=request.user,
                reason="Disabled by a platform admin.",
            ),
        )

    @admin.action(description="Enable selected endpoints", permissions=["change"])
    def enable_selected(self, request, queryset) -> None:
        self._each(
            request,
            queryset,
            lambda e: endpoint_enable(tenant=e.tenant_id, endpoint_id=e.pk, actor=request.user),
        )


class DeliveryJobFilter(OneJobFilter):
    """The deliveries of one job's events."""

    def of_job(self, queryset, job_id: int):
        return queryset.filter(event_id__in=job_event_ids(job_id))


class WebhookAttemptInline(admin.TabularInline):
    """The delivery's attempt history, the latest first."""

    model = WebhookAttempt
    fields = ("number", "started_at_shown", "status_code", "latency_ms", "error", "response")
    readonly_fields = fields
    ordering = ("-number",)
    extra = 0
    can_delete = False
    verbose_name_plural = "attempts"

    started_at_shown = shown_at("started_at", "started")
    response = shown_text("response_excerpt", "answer", css="excerpt")

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(NeverDeletedAdmin, admin.ModelAdmin):
    list_display = (
        "id",
        "endpoint",
        "tenant",
        "event_type",
        "status",
        "way_forward",
        "attempts",
        "last_answer",
        "created_shown",
        "job",
    )
    list_filter = (
        "status",
        "event_type",
        DeliveryJobFilter,
        # Endpoints and tenants are few; a DISTINCT over every delivery would not be.
        "endpoint",
        "tenant",
    )
    search_fields = ("=message_id",)
    list_select_related = ("endpoint", "tenant")
    ordering = ("-id",)
    show_full_result_count = False
    inlines = (WebhookAttemptInline,)
    actions = ("redeliver",)
    fields = (
        "id",
        "message_id",
        "endpoint",
        "tenant",
        "event_type",
        "job",
        "status",
        "way_forward",
        "attempts",
        "last_status_code",
        "last_latency_ms",
        "last_error_text",
        "created_shown",
        "next_attempt_shown",
        "finished_shown",
        "scheduled_run",
        "body_json",
    )
    readonly_fields = fields

    def get_changelist_instance(self, request):
        changelist = super().get_changelist_instance(request)
        # The page's jobs in one query, not one a row.
        jobs = event_job_ids([d.event_id for d in changelist.result_list])
        for delivery in changelist.result_list:
            delivery.job_id = jobs.get(delivery.event_id)
        return changelist

    @admin.display(description="job")
    def job(self, obj: WebhookDelivery) -> str:
        if not hasattr(obj, "job_id"):
            obj.job_id = event_job_ids([obj.event_id]).get(obj.event_id)
        return change_link("job_job", obj.job_id, f"job {obj.job_id}")

    @admin.display(description="last answer")
    def last_answer(self, obj: WebhookDelivery) -> str:
        """The last attempt's HTTP status and time (its error when nothing answered)."""
        if not obj.attempts:
            return "—"
        if obj.last_status_code is None:
            return f"no answer ({obj.last_latency_ms} ms)"
        return f"HTTP {obj.last_status_code} ({obj.last_latency_ms} ms)"

    created_shown = shown_at("created_at", "created", ordering="created_at")
    next_attempt_shown = shown_at("next_attempt_at", "next attempt")
    finished_shown = shown_at("finished_at", "finished")
    last_error_text = shown_text("last_error", "last error")

    @admin.display(description="its run")
    def scheduled_run(self, obj: WebhookDelivery) -> str:
        return change_link("outbox_taskrun", obj.scheduled_run_id)

    @admin.display(description="body")
    def body_json(self, obj: WebhookDelivery) -> str:
        try:
            return pretty_json(json.loads(obj.body))
        except ValueError:
            return format_html("<pre>{}</pre>", obj.body)

    @admin.display(description="Way forward")
    def way_forward(self, obj: WebhookDelivery) -> str:
        """What moves a pending delivery, so that a parked or held one is not taken for one
        retrying (DELIVERY_WAYS_FORWARD)."""
        if obj.is_final:
            return "-"
        if not obj.is_parked:
            when = moment(obj.next_attempt_at) if obj.next_attempt_at else ""
            return f"scheduled: attempt {obj.attempts + 1} due {when}".rstrip()
        if not obj.endpoint.is_active:
            return "held: its endpoint is disabled (enable it to resume)"
        return "parked: waits for its endpoint's probe to succeed"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_redeliver_permission(self, request) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    @admin.action(description="Redeliver the selected deliveries", permissions=["redeliver"])
    def redeliver(self, request, queryset) -> None:
        """A delivered or failed delivery is attempted once more, due now."""
        act_on_each(
            self,
            request,
            queryset.values_list("pk", flat=True),
            lambda delivery_id: delivery_redeliver(delivery_id=delivery_id, actor=request.user),
            done_message="{count} delivery(ies) due again now: a worker attempts each next.",
            refusal_level=messages.WARNING,
            named=lambda delivery_id: f"Delivery {delivery_id}",
        )


@task_run_outcome("webhook.deliver")
def deliver_runs_shown(runs, payloads: dict[str, dict]) -> dict[str, str]:
    """A webhook.deliver run succeeds whatever the receiver answered: show what its attempt
    got and where its delivery stands, linked to the delivery."""
    asked = {}
    for run in runs:
        delivery_id = payloads.get(str(run.run_id), {}).get("delivery_id")
        if isinstance(delivery_id, int) and not isinstance(delivery_id, bool):
            asked[str(run.run_id)] = (delivery_id, run.started_at, run.finished_at)
    shown = {}
    for run_id, outcome in deliver_runs_outcomes(asked).items():
        url = reverse("admin:webhook_webhookdelivery_change", args=[outcome.delivery_id])
        shown[run_id] = format_html(
            '<a class="{}" href="{}">{}</a>',
            "delivered" if outcome.attempt_delivered else "not-delivered",
            url,
            str(outcome),
        )
    return shown


@job_page_links
def job_deliveries_link(job_id: int) -> list[str]:
    """The job's page links to the deliveries of its events."""
    url = reverse("admin:webhook_webhookdelivery_changelist")
    return [format_html('<a href="{}?job={}">its webhook deliveries</a>', url, job_id)]
