"""Django admin plumbing shared by the modules' admins (no models, nothing registered here)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import ValidationError
from django.db import DataError, OperationalError
from django.db.models import Model, Q, QuerySet
from django.forms.fields import InvalidJSONInput
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.timesince import timesince

from common.errors import DomainError, transaction_conflict
from common.jsondata import NOT_FINITE, PROBLEM, TOO_DEEP, first_flaw

logger = logging.getLogger("hubdommed.admin")


def adopt(target: Model, saved: Model) -> None:
    """Make the admin's in-memory object the row the service saved (the admin logs it next)."""
    for field in type(saved)._meta.concrete_fields:
        setattr(target, field.attname, getattr(saved, field.attname))
    target._state.adding = False
    target._state.db = saved._state.db


def refusal_of(exc: Exception) -> DomainError | None:
    """What to show an admin for an error a page ran into: a service's refusal, or the
    database's abort of a transaction that ran into another at the same moment
    (``transaction_conflict``: logged as the API logs it); None for anything else, a bug."""
    if isinstance(exc, DomainError):
        return exc
    conflict = transaction_conflict(exc) if isinstance(exc, OperationalError) else None
    if conflict is not None:
        logger.error("transaction aborted by a %s in the admin: %s", conflict.reason, exc)
    return conflict


class RefusedSavesShown:
    """A ``ModelAdmin`` mixin: a save the service refuses after its form was valid (a limit
    another creation reached in between, a row another person changed meanwhile) is an error
    message on the form's page, not a 500. The admin's transaction has been rolled back by
    then: nothing of the refused save is kept. (A transaction the database aborts is shown
    the same way on every page of the site: ``HubAdminSite.admin_view``.)"""

    def changeform_view(self, request, object_id=None, form_url="", extra_context=None):
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except DomainError as refusal:
            self.message_user(request, refusal.message, messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())


class BadQueriesRefused:
    """A ``ModelAdmin`` mixin: what a list's URL asks that the database cannot run, and
    selections that name no row, are the admin's own refusals, not a 500.

    - A list filters on whatever field lookup its query string names (Django's admin allows
      any lookup on the model's own fields): ``?name__regex=(``, ``?id__range=1``, a year
      out of range, text for an array. Such a lookup fails only when its query runs, and
      the rows are otherwise read while the template renders, past the admin's handling of
      bad parameters. The page's rows are read here, and a failure is Django's "bad
      parameters" answer (``IncorrectLookupParameters``: the list again, marked so).
    - An action over ids that are not ids of this model (``abc`` for a number, a number for
      a UUID) is Django's "select some items" message, not a failed query.
    """

    def get_changelist_instance(self, request):
        try:
            changelist = super().get_changelist_instance(request)
            len(changelist.result_list)  # read here, kept for the template
        except (DataError, ValueError, TypeError, OverflowError, ValidationError) as exc:
            raise IncorrectLookupParameters(exc) from exc
        return changelist

    def response_action(self, request, queryset):
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                self.opts.pk.to_python(value)
        except ValidationError:
            self.message_user(
                request,
                "Items must be selected in order to perform actions on them. "
                "No items have been changed.",
                messages.WARNING,
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)


class NeverDeletedAdmin(BadQueriesRefused, RefusedSavesShown):
    """A ``ModelAdmin`` mixin: nothing is deleted for real, so no delete view and no action;
    and a save its service refuses is shown, not a 500 (``RefusedSavesShown``)."""

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
        """Deactivate each selected row through ``deactivate`` (``act_on_each``)."""
        act_on_each(
            self,
            request,
            queryset,
            deactivate,
            done_message=done_message,
            refusal_level=self.refusal_level,
        )


def act_on_each(
    model_admin: admin.ModelAdmin,
    request,
    rows: Iterable[Any],
    act: Callable[[Any], Any],
    *,
    done_message: str = "",
    refusal_level: int = messages.ERROR,
    named: Callable[[Any], str] = str,
) -> None:
    """An admin action's work: ``act`` on each selected row (or its id), a refusal stopping
    only its row.

    A refusal is shown as ``<named(row)>: <why>`` at ``refusal_level``; ``done_message``,
    formatted with ``count`` (the rows that went through), once any did.
    """
    count = 0
    for row in rows:
        try:
            act(row)
        except (DomainError, OperationalError) as exc:
            refusal = refusal_of(exc)
            if refusal is None:
                raise
            model_admin.message_user(request, f"{named(row)}: {refusal.message}", refusal_level)
        else:
            count += 1
    if count and done_message:
        model_admin.message_user(request, done_message.format(count=count), messages.SUCCESS)


def deactivate_action(description: str, deactivate: Callable[[Model, Any], Any]):
    """A ``DeactivatableAdmin`` action calling ``deactivate(row, actor)`` for each selected
    row (``deactivate_each``)."""

    # Offered only to those who may change the rows: a view-only operator sees no such action.
    @admin.action(description=description, permissions=["change"])
    def action(model_admin: DeactivatableAdmin, request, queryset: QuerySet) -> None:
        model_admin.deactivate_each(
            request,
            queryset,
            lambda row: deactivate(row, request.user),
            done_message="{count} deactivated.",
        )

    return action


class EditedAsShownForm(forms.ModelForm):
    """A change form whose save writes only what its operator changed on the page.

    Each field carries, hidden beside it, its value as the page showed it
    (``show_hidden_initial``): what the form counts as changed (``changed_data``, what the
    admins hand to their services) is what differs from that, not from the row as it is
    when the form comes back. A change another person made while the page was open (another
    operator, a manager through the API) is kept, not set back to what the page showed.
    A form sent without those values (not from the page) is compared with the row as it is.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is None:
            return
        for name, field in self.fields.items():
            if not self.is_bound or self.add_initial_prefix(name) in self.data:
                field.show_hidden_initial = True


# A form error's message, by the kind of flaw ``first_flaw`` found (its code).
_FLAWS = {"too_deep": TOO_DEEP, "unstorable_text": PROBLEM, "not_finite": NOT_FINITE}


class StorableJSONField(forms.JSONField):
    """A form's JSON field that refuses text jsonb or UTF-8 cannot hold, and documents
    nested deeper than the API takes.

    JSON typed into a form is parsed here, not by the API's parser, and can spell U+0000
    or a lone surrogate (``"\\ud800"``), a number jsonb cannot hold (``NaN``,
    ``Infinity``, ``1e999``), or nest deeper than Python's parser can read
    (``RecursionError``, a 500): the same checks, as form errors. The field then shows the
    text as typed: re-encoding the parsed value would fail on the surrogate.
    """

    def to_python(self, value):
        try:
            value = super().to_python(value)
        except RecursionError:
            raise ValidationError(TOO_DEEP, code="too_deep") from None
        flaw = first_flaw(value)
        if flaw is not None:
            raise ValidationError(_FLAWS[flaw.kind], code=flaw.kind)
        return value

    def bound_data(self, data, initial):
        try:
            value = super().bound_data(data, initial)
        except RecursionError:
            return InvalidJSONInput(data)
        if first_flaw(value) is not None:
            return InvalidJSONInput(data)
        return value

    def prepare_value(self, value):
        # An empty field starts empty, not with the text "null" (which a user would have to
        # delete, and which saves as JSON null if left).
        if value is None:
            return ""
        return super().prepare_value(value)


class ChoiceFilter(admin.SimpleListFilter):
    """A list filter of a few choices, each a condition on the rows: a subclass sets
    ``conditions``, ``{value: (label, condition)}``; any other value filters nothing."""

    # Not ``choices``: SimpleListFilter's method of that name renders the choices.
    conditions: dict[str, tuple[str, Q]] = {}

    def lookups(self, request, model_admin):
        return [(value, label) for value, (label, _) in self.conditions.items()]

    def queryset(self, request, queryset):
        if self.value() in self.conditions:
            _, condition = self.conditions[self.value()]
            return queryset.filter(condition)
        return queryset


def age_filter(field: str, title: str = "age") -> type[admin.SimpleListFilter]:
    """A list filter on how long ago ``field`` was (rows waiting too long stand out)."""

    class AgeFilter(admin.SimpleListFilter):
        parameter_name = f"{field}_age"

        def lookups(self, request, model_admin):
            return [(key, label) for key, (label, _) in AGES.items()]

        def queryset(self, request, queryset):
            if self.value() not in AGES:
                return queryset
            _, (newer, older) = AGES[self.value()]
            now = timezone.now()
            if newer is not None:
                queryset = queryset.filter(**{f"{field}__gte": now - newer})
            if older is not None:
                queryset = queryset.filter(**{f"{field}__lt": now - older})
            return queryset

    AgeFilter.title = title
    return AgeFilter


# key: (label, (newer than, older than)).
AGES: dict[str, tuple[str, tuple[timedelta | None, timedelta | None]]] = {
    "lt5m": ("less than 5 minutes", (timedelta(minutes=5), None)),
    "gt5m": ("more than 5 minutes", (None, timedelta(minutes=5))),
    "gt1h": ("more than an hour", (None, timedelta(hours=1))),
    "gt1d": ("more than a day", (None, timedelta(days=1))),
    "gt7d": ("more than a week", (None, timedelta(days=7))),
}


def age(moment: datetime | None) -> str:
    """How long ago, for a list column ("3 minutes")."""
    return timesince(moment) if moment else "—"


def moment(value: datetime | None) -> str:
    """A time to the second with its zone, as the console shows every time
    ("2026-12-02 10:04:05 UTC")."""
    if value is None:
        return "—"
    return timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S %Z")


def duration(start: datetime | None, end: datetime | None) -> str:
    """How long from ``start`` to ``end`` ("1 h 02 min 05 s", "0.4 s"); "—" without a start."""
    if start is None or end is None:
        return "—"
    seconds = max((end - start).total_seconds(), 0.0)
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = int(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


def pretty_json(value: Any) -> str:
    """A JSON value as an indented block on a read-only page."""
    return format_html("<pre>{}</pre>", json.dumps(value, indent=2, ensure_ascii=False))


def change_link(model: str, pk: Any, text: str | None = None) -> str:
    """A link to one row's admin page (``model``: ``"job_job"``), or "—" without a row."""
    if pk is None:
        return "—"
    url = reverse(f"admin:{model}_change", args=[pk])
    return format_html('<a href="{}">{}</a>', url, pk if text is None else text)


class OneJobFilter(admin.SimpleListFilter):
    """The rows of one job (``?job=<id>``: the job's page links here). A subclass says which
    rows are the job's in ``of_job``."""

    title = "job"
    parameter_name = "job"

    def lookups(self, request, model_admin):
        # Chosen from a job's page, not from a list of every job.
        return [(self.value(), f"job {self.value()}")] if self.value() else []

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        try:
            job_id = int(self.value())
        except ValueError:
            raise IncorrectLookupParameters("job: an id is a number") from None
        return self.of_job(queryset, job_id)

    def of_job(self, queryset, job_id: int):
        raise NotImplementedError


# Columns and read-only fields that show one field of the row the console's way; each
# stands for an ``@admin.display`` method (``started_shown = shown_at("started_at", ...)``).


def shown_at(field: str, description: str, *, ordering: str | None = None):
    """The time in ``field`` to the second with its zone (``moment``)."""

    @admin.display(description=description, ordering=ordering)
    def show(model_admin, obj) -> str:
        return moment(getattr(obj, field))

    return show


def shown_text(field: str, description: str, *, css: str = "error-text"):
    """The text in ``field`` whole, kept as written (an error, a command's output)."""

    @admin.display(description=description)
    def show(model_admin, obj) -> str:
        return format_html('<pre class="{}">{}</pre>', css, getattr(obj, field) or "—")

    return show


def shown_json(field: str, description: str):
    """The JSON value in ``field``, indented (``pretty_json``)."""

    @admin.display(description=description)
    def show(model_admin, obj) -> str:
        return pretty_json(getattr(obj, field))

    return show


class ReadOnlyAdmin(NeverDeletedAdmin):
    """A ``ModelAdmin`` mixin for rows only services write: looked at, never added or
    edited here (the admin's actions call the services)."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def may_operate(self, request) -> bool:
        """Whether the user may run the operators' actions: the model's change permission."""
        opts = self.opts
        codename = f"{opts.app_label}.change_{opts.model_name}"
        return request.user.is_active and request.user.has_perm(codename)
