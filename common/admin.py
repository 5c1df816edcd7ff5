"""Django admin plumbing shared by the modules' admins (no models, nothing registered here)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db.models import Model, QuerySet
from django.forms.fields import InvalidJSONInput

from common.errors import DomainError
from common.jsondata import PROBLEM, unstorable_path


def adopt(target: Model, saved: Model) -> None:
    """Make the admin's in-memory object the row the service saved (the admin logs it next)."""
    for field in type(saved)._meta.concrete_fields:
        setattr(target, field.attname, getattr(saved, field.attname))
    target._state.adding = False
    target._state.db = saved._state.db


class NeverDeletedAdmin:
    """A ``ModelAdmin`` mixin: nothing is deleted for real, so no delete view and no action."""

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class DeactivatableAdmin(NeverDeletedAdmin):
    """A ``ModelAdmin`` mixin for rows that are deactivated instead of deleted.

    A deactivated row is kept as it was: shown, not edited (as in the API). The modules'
    deactivate actions call ``deactivate_each`` with their own service.
    """

    # How a refused deactivation is shown (an already retired row, a sector still in use).
    refusal_level = messages.ERROR

    def has_change_permission(self, request, obj=None) -> bool:
        return super().has_change_permission(request, obj) and (obj is None or obj.is_active)

    def deactivate_each(
        self,
        request,
        queryset: QuerySet,
        deactivate: Callable[[Model], Any],
        *,
        done_message: str,
    ) -> None:
        """Deactivate each selected row through ``deactivate``; a refusal stops only its row.

        ``done_message`` is formatted with ``count``, the rows deactivated.
        """
        count = 0
        for obj in queryset:
            try:
                deactivate(obj)
            except DomainError as refusal:
                self.message_user(request, f"{obj}: {refusal.message}", self.refusal_level)
            else:
                count += 1
        if count:
            self.message_user(request, done_message.format(count=count), messages.SUCCESS)


class StorableJSONField(forms.JSONField):
    """A form's JSON field that refuses text jsonb or UTF-8 cannot hold.

    JSON typed into a form is parsed here, not by the API's parser, and can spell U+0000
    or a lone surrogate (``"\\ud800"``): the same check, as a form error. The field then
    shows the text as typed: re-encoding the parsed value would fail on the surrogate.
    """

    def to_python(self, value):
        value = super().to_python(value)
        if unstorable_path(value) is not None:
            raise ValidationError(PROBLEM, code="unstorable_text")
        return value

    def bound_data(self, data, initial):
        value = super().bound_data(data, initial)
        if unstorable_path(value) is not None:
            return InvalidJSONInput(data)
        return value
