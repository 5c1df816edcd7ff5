"""The admin site: the operators' console of Hub DomMed.

Its front page answers "what is wrong now?" before the models' list: the outbox's backlog
and its age, the task runs failing, the dead letters per queue, each daemon's last
heartbeat, the webhook endpoints failing and the schedules paused with their reason. Each
figure comes from its module's console selectors (read-only) and links to the filtered
list it counts. Besides the modules' models the site serves the dead-letter queues' page
(``worker.admin``), listed on the index with the models. "View site" leads to the API's
documentation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime

from django.contrib import admin, messages
from django.db import OperationalError
from django.http import Http404, HttpResponseRedirect
from django.urls import path, reverse, reverse_lazy
from django.utils import timezone
from django.utils.http import urlencode

from common.admin import age, moment, refusal_of
from common.heartbeats import DAEMONS, heartbeats_last
from outbox.console import outbox_backlogs, task_runs_failing
from schedule.console import schedules_paused
from webhook.console import endpoints_health
from worker.admin import dead_letters_view
from worker.console import dead_letters_waiting

# Seconds after which a daemon's last heartbeat is stale: the health checks' bounds
# (docs/OPERATIONS.md), the monitor's cycle being the longest.
HEARTBEAT_STALE_AFTER = {"relay": 60, "worker": 60, "scheduler": 60, "monitor": 120}


@dataclass
class Figure:
    """One line of the console: what it counts, how many, and the list that shows them."""

    label: str
    value: str
    url: str = ""
    # Whether it is something to look at now (shown as a warning).
    alarming: bool = False
    detail: str = ""
    # Lines under it (a paused schedule and its reason), each (text, url).
    items: list[tuple[str, str]] = field(default_factory=list)


def _url(name: str, **query) -> str:
    url = reverse(f"admin:{name}")
    return f"{url}?{urlencode(query)}" if query else url


def _since(moment_: datetime | None) -> str:
    return f"{age(moment_)} ago, since {moment(moment_)}" if moment_ else ""


@dataclass
class Section:
    """A box of the console: its title leads to the page of the whole subject."""

    title: str
    url: str
    figures: list[Figure]


def console_sections(request, now: datetime) -> list[Section]:
    user = request.user
    sections: list[Section] = []

    if user.has_perm("outbox.view_outboxmessage") or user.has_perm(
        "outbox.view_platformoutboxmessage"
    ):
        figures = []
        for backlog, name in zip(
            outbox_backlogs(now=now),
            ("outbox_outboxmessage_changelist", "outbox_platformoutboxmessage_changelist"),
            strict=True,
        ):
            oldest = backlog.oldest_created_at
            figures.append(
                Figure(
                    label=f"{backlog.table} unsent",
                    value=str(backlog.pending),
                    url=_url(name, pending="yes"),
                    alarming=oldest is not None and (now - oldest).total_seconds() > 300,
                    detail=(
                        f"{backlog.due} due; the oldest waits {_since(oldest)}"
                        if oldest
                        else "nothing waits"
                    ),
                )
            )
        sections.append(Section("Outbox backlog", "", figures))

    if user.has_perm("outbox.view_taskrun"):
        failing = task_runs_failing()
        sections.append(
            Section(
                "Task runs",
                _url("outbox_taskrun_changelist"),
                [
                    Figure(
                        label=f"runs {status}",
                        value=str(count),
                        url=_url("outbox_taskrun_changelist", status__exact=status),
                        alarming=count > 0,
                    )
                    for status, count in failing.items()
                ],
            )
        )

    if user.is_superuser:
        counted = dead_letters_waiting()
        if counted.unavailable:
            letters = [
                Figure(
                    label="dead letters",
                    value="unavailable",
                    url=_url("dead-letters"),
                    alarming=True,
                    detail=f"the broker cannot be reached: {counted.unavailable}",
                )
            ]
        else:
            letters = [
                Figure(
                    label=f"{queue} dead letters",
                    value=str(waiting),
                    url=_url("dead-letters", queue=queue),
                    alarming=waiting > 0,
                )
                for queue, waiting in counted.waiting.items()
            ]
        sections.append(Section("Dead letters", _url("dead-letters"), letters))

        beats = heartbeats_last()
        daemons = []
        for daemon in DAEMONS:
            if beats is None:
                daemons.append(
                    Figure(daemon, "unavailable", alarming=True, detail="Redis cannot be read")
                )
                continue
            last = beats[daemon]
            stale = last is None or (now - last).total_seconds() > HEARTBEAT_STALE_AFTER[daemon]
            daemons.append(
                Figure(
                    label=daemon,
                    value=f"{age(last)} ago" if last else "never seen",
                    alarming=stale,
                    detail=f"last heartbeat {moment(last)}" if last else "no heartbeat recorded",
                )
            )
        sections.append(Section("Daemons' last heartbeat", "", daemons))

    if user.has_perm("webhook.view_webhookendpoint"):
        health = endpoints_health()
        sections.append(
            Section(
                "Webhook endpoints",
                _url("webhook_webhookendpoint_changelist"),
                [
                    Figure(
                        label="endpoints failing",
                        value=str(health.failing),
                        url=_url("webhook_webhookendpoint_changelist", health="failing"),
                        alarming=health.failing > 0,
                        detail=f"the first {_since(health.oldest_failing_since)}"
                        if health.oldest_failing_since
                        else "",
                    ),
                    Figure(
                        label="endpoints disabled",
                        value=str(health.disabled),
                        url=_url("webhook_webhookendpoint_changelist", status__exact="disabled"),
                    ),
                ],
            )
        )

    if user.has_perm("schedule.view_schedule"):
        count, shown = schedules_paused()
        sections.append(
            Section(
                "Schedules",
                _url("schedule_schedule_changelist"),
                [
                    Figure(
                        label="schedules paused",
                        value=str(count),
                        url=_url("schedule_schedule_changelist", state="paused"),
                        alarming=count > 0,
                        items=[
                            (
                                f"{paused.name}: {paused.reason or 'no reason given'} "
                                f"(since {moment(paused.paused_at)})",
                                reverse("admin:schedule_schedule_change", args=[paused.id]),
                            )
                            for paused in shown
                        ],
                    )
                ],
            )
        )
    return sections


class HubAdminSite(admin.AdminSite):
    site_header = "Hub DomMed"
    site_title = "Hub DomMed admin"
    index_title = "Operations"
    site_url = reverse_lazy("api-docs")
    index_template = "admin/console_index.html"
    # The lists' columns need the width more than the models' menu does, which the
    # breadcrumbs and the front page give anyway.
    enable_nav_sidebar = False

    def has_permission(self, request) -> bool:
        # Platform admins only: staff without a tenant (``User.is_platform_admin``).
        return bool(getattr(request.user, "is_platform_admin", False))

    def index(self, request, extra_context=None):
        now = timezone.now()
        context = {
            "console": console_sections(request, now),
            "console_at": moment(now),
            **(extra_context or {}),
        }
        return super().index(request, context)

    @staticmethod
    def _no_page_on_site(request, rest: str):
        raise Http404("No page on the site for this row.")

    def admin_view(self, view, cacheable=False):
        """Every page of the site (the models' included): a transaction the database
        aborted for another's sake, anywhere in it, is a message on the page it came from,
        as a refusal is, not a 500. Nothing of it was kept; trying again may go through."""
        guarded = super().admin_view(view, cacheable)

        @functools.wraps(view)
        def conflicts_shown(request, *args, **kwargs):
            try:
                return guarded(request, *args, **kwargs)
            except OperationalError as exc:
                refusal = refusal_of(exc)
                if refusal is None:
                    raise
                messages.error(request, refusal.message)
                return HttpResponseRedirect(request.get_full_path())

        return conflicts_shown

    def get_urls(self):
        own = [
            # Django's "view on site" redirect: no model here has a page of its own on the
            # site, and its lookup of the id took a UUID key's bad id for a 500.
            path("r/<path:rest>", self._no_page_on_site),
            path(
                "dead-letters/",
                self.admin_view(lambda request: dead_letters_view(self, request)),
                name="dead-letters",
            ),
        ]
        return own + super().get_urls()

    def get_app_list(self, request, app_label=None):
        apps = super().get_app_list(request, app_label)
        if request.user.is_superuser and app_label in (None, "worker"):
            url = reverse("admin:dead-letters", current_app=self.name)
            apps.append(
                {
                    "name": "Broker",
                    "app_label": "worker",
                    "app_url": url,
                    "has_module_perms": True,
                    "models": [
                        {
                            "name": "Dead letters",
                            "object_name": "DeadLetter",
                            "perms": {"view": True},
                            "admin_url": url,
                            "add_url": None,
                            "view_only": True,
                        }
                    ],
                }
            )
        return apps
