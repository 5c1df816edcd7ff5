"""The dead-letter queues in the operators' console: a page of the admin site, not a model.

Lists each queue's dead letters with the failure context the runtime attached (on either
broker), and sends back or purges one of them or all, through ``worker.dead_letters``
(the code behind ``manage.py dead_letters``). Platform admins (superusers) only.
"""

from __future__ import annotations

from dataclasses import dataclass

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.http import urlencode

from broker import TransportUnavailable, topology
from broker.consume import DeadLetter
from broker.topology import QUEUES
from worker.dead_letters import dead_letters_list, dead_letters_purge, dead_letters_redrive

# Dead letters shown per queue (the count says how many wait in all).
PAGE_LIMIT = 100


class DestinationField(forms.CharField):
    def validate(self, value) -> None:
        super().validate(value)
        try:
            topology.check_destination(value)
        except topology.UnknownDestination as exc:
            raise forms.ValidationError(str(exc)) from None


class ShowForm(forms.Form):
    queue = DestinationField(
        required=False,
        help_text="A queue class (critical, default, bulk, maintenance) or automation-<id>; "
        "empty: the four classes.",
    )


class ActionForm(forms.Form):
    ACTIONS = ("redrive", "redrive_all", "purge", "purge_all")

    action = forms.ChoiceField(choices=[(a, a) for a in ACTIONS])
    destination = DestinationField()
    run_id = forms.CharField(required=False)
    confirmed = forms.BooleanField(required=False)
    # The queue the page was showing, to go back to it.
    shown = forms.CharField(required=False)

    def clean(self):
        cleaned = super().clean()
        if cleaned.get("action") in ("redrive", "purge") and not cleaned.get("run_id"):
            raise forms.ValidationError("Which message? (its run id)")
        return cleaned


@dataclass(frozen=True)
class LetterRow:
    """A dead letter as the page shows it."""

    run_id: str
    task: str
    receive_count: str
    failed_at: str
    error_type: str
    error_message: str
    traceback: str
    worker: str

    @classmethod
    def of(cls, letter: DeadLetter) -> LetterRow:
        error = letter.error
        return cls(
            run_id=letter.run_id or "",
            task=letter.task,
            receive_count=error.get("x-error-receive-count", "?"),
            failed_at=error.get("x-error-failed-at", ""),
            error_type=error.get("x-error-type", ""),
            error_message=error.get("x-error-message", ""),
            traceback=""
            if error.get("x-error-traceback") == "-"
            else error.get("x-error-traceback", ""),
            worker=error.get("x-error-worker", ""),
        )


@dataclass(frozen=True)
class QueueBox:
    destination: str
    queue: str
    waiting: int
    rows: list[LetterRow]


def dead_letters_view(site, request: HttpRequest) -> HttpResponse:
    if not request.user.is_superuser:
        raise PermissionDenied
    if request.method == "POST":
        return _act(site, request)
    form = ShowForm(request.GET or None)
    shown = ""
    if form.is_valid():
        shown = form.cleaned_data["queue"]
    destinations = [shown] if shown else list(QUEUES)
    parked, unavailable = [], ""
    try:
        parked = [
            QueueBox(
                box.destination,
                box.queue,
                box.waiting,
                [LetterRow.of(item) for item in box.letters],
            )
            for box in dead_letters_list(destinations, limit=PAGE_LIMIT)
        ]
    except TransportUnavailable as exc:
        unavailable = str(exc)
    context = {
        **site.each_context(request),
        "title": "Dead letters",
        "form": form,
        "shown": shown,
        "parked": parked,
        "unavailable": unavailable,
        "broker": settings.BROKER,
    }
    return TemplateResponse(request, "admin/worker/dead_letters.html", context)


def _act(site, request: HttpRequest) -> HttpResponse:
    form = ActionForm(request.POST)
    if not form.is_valid():
        messages.error(request, _errors(form))
        return _back(request.POST.get("shown", ""))
    data = form.cleaned_data
    action, destination = data["action"], data["destination"]
    everything = action.endswith("_all")
    if action == "purge_all" and not data["confirmed"]:
        context = {
            **site.each_context(request),
            "title": "Purge every dead letter?",
            "destination": destination,
            "queue": topology.dead_letter_queue_name(destination),
            "shown": data["shown"],
        }
        return TemplateResponse(request, "admin/worker/dead_letters_purge.html", context)
    run_ids = None if everything else {data["run_id"]}
    actor = f"user:{request.user.pk}"
    try:
        if action.startswith("redrive"):
            done = dead_letters_redrive(destination, run_ids=run_ids, actor=actor)
            verb = "sent back to their queue"
        else:
            done = dead_letters_purge(destination, run_ids=run_ids, actor=actor)
            verb = "purged"
    except TransportUnavailable as exc:
        messages.error(request, f"The broker cannot be reached: {exc}")
        return _back(data["shown"])
    if done:
        messages.success(request, f"{len(done)} message(s) of {destination} {verb}.")
    else:
        messages.warning(request, f"Nothing done: no such message in {destination}'s dead letters.")
    return _back(data["shown"])


def _back(shown: str) -> HttpResponseRedirect:
    url = reverse("admin:dead-letters")
    return HttpResponseRedirect(f"{url}?{urlencode({'queue': shown})}" if shown else url)


def _errors(form: forms.Form) -> str:
    return "; ".join(f"{' '.join(errors)}" for errors in form.errors.values())
