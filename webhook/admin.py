"""Webhook endpoints and their deliveries in the Django admin, through the same services as
the API. A secret is shown once, in the message after a creation or a rotation."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from common.admin import NeverDeletedAdmin, adopt
from common.errors import DomainError
from webhook.models import WebhookDelivery, WebhookEndpoint
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


class EndpointAdminForm(forms.ModelForm):
    event_types = forms.CharField(help_text="Comma-separated, e.g. JobCompleted, JobFailed.")

    class Meta:
        model = WebhookEndpoint
        fields = ("tenant", "url", "event_types", "description")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
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


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(NeverDeletedAdmin, admin.ModelAdmin):
    form = EndpointAdminForm
    list_display = ("url", "tenant", "status", "failing_since", "created_at")
    list_filter = ("status",)
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
        for endpoint in queryset:
            try:
                action(endpoint)
            except DomainError as exc:
                messages.error(request, f"{endpoint.url}: {exc.message}")

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


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(NeverDeletedAdmin, admin.ModelAdmin):
    list_display = (
        "message_id",
        "endpoint",
        "event_type",
        "status",
        "way_forward",
        "attempts",
        "last_status_code",
        "last_latency_ms",
        "created_at",
    )
    list_filter = ("status", "event_type")
    search_fields = ("message_id",)
    list_select_related = ("endpoint",)

    @admin.display(description="Way forward")
    def way_forward(self, obj: WebhookDelivery) -> str:
        """What moves a pending delivery, so that a parked or held one is not taken for one
        retrying (DELIVERY_WAYS_FORWARD)."""
        if obj.is_final:
            return "-"
        if not obj.is_parked:
            when = obj.next_attempt_at.isoformat(timespec="seconds") if obj.next_attempt_at else ""
            return f"scheduled: attempt {obj.attempts + 1} due {when}".rstrip()
        if not obj.endpoint.is_active:
            return "held: its endpoint is disabled (enable it to resume)"
        return "parked: waits for its endpoint's probe to succeed"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
