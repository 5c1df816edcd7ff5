"""Automations and their workers in the Django admin: one page, one transaction, one service.

The worker is edited inline on its automation's page. Saving does not let the admin write
the rows itself: ``save_model`` defers, and ``save_related`` (which sees the worker's
inline form too) calls ``automation_create`` or ``automation_update``, so the admin
records exactly the events the API records. The admin runs all of it inside the single
transaction of ``changeform_view``. The worker's credential is shown once, as a message.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.forms.models import BaseInlineFormSet
from django.utils.html import format_html

from automation.models import AUTOMATION_FIELDS, MACHINE_FIELDS, Automation, Worker
from automation.services import (
    automation_create,
    automation_deactivate,
    automation_update,
    worker_rotate_credential,
)
from automation.validation import automation_errors, machine_errors
from common.admin import DeactivatableAdmin, EditedAsShownForm, StorableJSONField, adopt
from common.errors import DomainError
from sector.selectors import sectors_active


def add_errors(form: forms.BaseForm, errors: dict[str, list[str]]) -> None:
    for field, problems in errors.items():
        target = field if field in form.fields else None
        for problem in problems:
            if target is None or target not in getattr(form, "_errors", {}):
                form.add_error(target, problem)


class AutomationAdminForm(EditedAsShownForm):
    class Meta:
        model = Automation
        fields = AUTOMATION_FIELDS
        field_classes = {"command": StorableJSONField, "params_schema": StorableJSONField}
        help_texts = {
            "command": "The argument list the worker runs, as a JSON array of strings "
            '(never a shell line), e.g. ["python", "export.py", "--full"].',
            "params_schema": "A JSON Schema object the jobs' parameters must match, e.g. "
            '{"type": "object", "properties": {"month": {"type": "string"}}, '
            '"required": ["month"]}. Empty: any JSON object is accepted.',
        }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if "sector" in self.fields:
            # Automations are filed under active sectors only.
            self.fields["sector"].queryset = sectors_active()

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        present = {f: cleaned[f] for f in AUTOMATION_FIELDS if f in cleaned and f != "sector"}
        add_errors(self, automation_errors(present))
        return cleaned


class WorkerInlineForm(EditedAsShownForm):
    class Meta:
        model = Worker
        fields = MACHINE_FIELDS

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean()
        if all(field in cleaned for field in MACHINE_FIELDS):
            add_errors(self, machine_errors(**{f: cleaned[f] for f in MACHINE_FIELDS}))
        return cleaned


class OneWorkerFormSet(BaseInlineFormSet):
    """Exactly one worker form, whatever the post says: Django's admin does not hold a
    posted formset to ``min_num`` and ``max_num`` by itself, and its ``validate_min`` would
    count a worker left as proposed (unchanged) as none."""

    def clean(self) -> None:
        super().clean()
        if self.total_form_count() != 1:
            raise ValidationError("An automation has exactly one worker: fill in its machine.")


class WorkerInline(admin.StackedInline):
    model = Worker
    form = WorkerInlineForm
    formset = OneWorkerFormSet
    fields = (
        *MACHINE_FIELDS,
        "status",
        "last_seen_at",
        "credential_prefix",
        "credential_rotated_at",
        "is_active",
    )
    readonly_fields = (
        "status",
        "last_seen_at",
        "credential_prefix",
        "credential_rotated_at",
        "is_active",
    )
    # Exactly one worker, born with the automation.
    min_num = 1
    max_num = 1
    extra = 0
    can_delete = False
    verbose_name_plural = "worker"

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Automation)
class AutomationAdmin(DeactivatableAdmin, admin.ModelAdmin):
    form = AutomationAdminForm
    inlines = (WorkerInline,)
    list_display = (
        "name",
        "slug",
        "sector",
        "max_concurrency",
        "worker_provider",
        "worker_status",
        "is_active",
    )
    list_filter = ("is_active", "sector", "worker__provider", "worker__status")
    list_select_related = ("sector", "worker")
    search_fields = ("name", "slug", "description", "worker__machine_id")
    prepopulated_fields = {"slug": ("name",)}
    readonly_fields = ("is_active", "created_at", "updated_at", "deactivated_at")
    fieldsets = (
        (None, {"fields": ("name", "slug", "description", "sector")}),
        (
            "Execution",
            {"fields": ("command", "max_concurrency", "timeout_seconds", "max_attempts")},
        ),
        ("Job parameters", {"fields": ("params_schema",)}),
        ("State", {"fields": ("is_active", "created_at", "updated_at", "deactivated_at")}),
    )
    actions = ("deactivate_selected", "rotate_worker_credential")

    @admin.display(description="provider", ordering="worker__provider")
    def worker_provider(self, automation: Automation) -> str:
        return automation.worker.get_provider_display()

    @admin.display(description="worker", ordering="worker__status")
    def worker_status(self, automation: Automation) -> str:
        return automation.worker.status

    def save_model(self, request, obj: Automation, form, change: bool) -> None:
        """Deferred to ``save_related``, which also sees the worker's inline form."""

    def save_related(self, request, form, formsets, change: bool) -> None:
        worker_form = self._worker_form(formsets)
        obj: Automation = form.instance
        if change:
            data = {
                ("sector_id" if f == "sector" else f): _value(form.cleaned_data[f])
                for f in form.changed_data
            }
            machine = {
                f: worker_form.cleaned_data[f]
                for f in worker_form.changed_data
                if f in MACHINE_FIELDS
            }
            saved = automation_update(
                automation_id=obj.pk, data=data, machine=machine, actor=request.user
            )
        else:
            fields = {f: form.cleaned_data[f] for f in AUTOMATION_FIELDS if f != "sector"}
            created = automation_create(
                sector_id=form.cleaned_data["sector"].pk,
                **fields,
                **{f: worker_form.cleaned_data[f] for f in MACHINE_FIELDS},
                actor=request.user,
            )
            saved = created.automation
            self._show_credential(request, saved, created.credential)
        adopt(obj, saved)

    def construct_change_message(self, request, form, formsets, add=False):
        # The inline rows were saved by the service, not by the formset: describe them here.
        message = super().construct_change_message(request, form, None, add)
        worker_form = self._worker_form(formsets)
        if not add and worker_form.changed_data:
            message.append(
                {
                    "changed": {
                        "name": "worker",
                        "object": str(form.instance),
                        "fields": worker_form.changed_data,
                    }
                }
            )
        return message

    @admin.action(description="Deactivate selected automations", permissions=["change"])
    def deactivate_selected(self, request, queryset) -> None:
        self.deactivate_each(
            request,
            queryset,
            lambda automation: automation_deactivate(
                automation_id=automation.pk, actor=request.user
            ),
            done_message="Deactivated {count} automation(s) and their workers.",
        )

    @admin.action(description="Rotate worker credential", permissions=["change"])
    def rotate_worker_credential(self, request, queryset) -> None:
        for automation in queryset:
            try:
                rotated = worker_rotate_credential(automation_id=automation.pk, actor=request.user)
            except DomainError as refusal:
                self.message_user(request, f"{automation}: {refusal.message}", messages.ERROR)
                continue
            self._show_credential(request, automation, rotated.credential)

    def _show_credential(self, request, automation: Automation, credential: str) -> None:
        self.message_user(
            request,
            format_html(
                "Worker credential of “{}”: <code>{}</code> — copy it now, it is not shown again.",
                automation.name,
                credential,
            ),
            messages.WARNING,
        )

    @staticmethod
    def _worker_form(formsets) -> forms.ModelForm:
        (formset,) = (fs for fs in formsets if fs.model is Worker)
        return formset.forms[0]


def _value(value: Any) -> Any:
    # A model choice field gives the Sector; the service takes ids.
    return value.pk if hasattr(value, "_meta") else value
