"""Two people on one row's admin page at once: each save changes what its operator changed
on the page, never setting back what the other changed meanwhile (a field the operator
left as shown is not theirs to write)."""

from __future__ import annotations

from collections.abc import Callable
from html.parser import HTMLParser

import pytest
from django.test import Client

from automation.services import automation_update
from identity.models import User
from identity.services import tenant_rename, user_update
from schedule.services import schedule_create, schedule_update
from sector.services import sector_update
from tests.factories import (
    AutomationWithWorkerFactory,
    ManagerFactory,
    PlatformAdminFactory,
    SectorFactory,
    TenantFactory,
    UserFactory,
)
from webhook.services import endpoint_create, endpoint_update

pytestmark = pytest.mark.django_db


class PageForm(HTMLParser):
    """What a browser sends when the page's change form is submitted as shown: every
    input, checked box, selected option and text area of the form, by name."""

    def __init__(self, html: str) -> None:
        super().__init__()
        self.data: dict[str, list[str]] = {}
        self._in_form = False
        self._select: str | None = None
        self._textarea: str | None = None
        self._text: list[str] = []
        self.feed(html)

    def _add(self, name: str | None, value: str) -> None:
        if name:
            self.data.setdefault(name, []).append(value)

    def handle_starttag(self, tag, attrs) -> None:
        attrs = dict(attrs)
        if tag == "form" and attrs.get("id", "").endswith("_form"):
            self._in_form = True
        if not self._in_form:
            return
        if tag == "input":
            kind = attrs.get("type", "text")
            if kind in ("submit", "button", "file") or (
                kind in ("checkbox", "radio") and "checked" not in attrs
            ):
                return
            self._add(attrs.get("name"), attrs.get("value") or ("on" if kind == "checkbox" else ""))
        elif tag == "select":
            self._select = attrs.get("name")
        elif tag == "option" and self._select and "selected" in attrs:
            self._add(self._select, attrs.get("value", ""))
        elif tag == "textarea":
            self._textarea, self._text = attrs.get("name"), []

    def handle_endtag(self, tag) -> None:
        if tag == "form":
            self._in_form = False
        elif tag == "select":
            self._select = None
        elif tag == "textarea" and self._textarea:
            self._add(self._textarea, "".join(self._text).removeprefix("\n"))
            self._textarea = None

    def handle_data(self, data) -> None:
        if self._textarea:
            self._text.append(data)


def opened(client: Client, url: str) -> dict[str, list[str]]:
    page = client.get(url)
    assert page.status_code == 200, page.status_code
    return PageForm(page.content.decode()).data


def operator() -> Client:
    client = Client(raise_request_exception=False)
    client.force_login(PlatformAdminFactory())
    return client


def a_schedule():
    tenant = TenantFactory()
    return schedule_create(
        tenant=tenant,
        actor=ManagerFactory(tenant=tenant),
        automation_id=AutomationWithWorkerFactory().pk,
        name="nightly",
        cron="0 3 * * *",
    )


def an_endpoint():
    tenant = TenantFactory()
    return endpoint_create(
        tenant=tenant,
        url="http://127.0.0.1:9/hook",
        event_types=["JobCompleted"],
        actor=ManagerFactory(tenant=tenant),
    )


# Each case: the row, the field this operator edits on the page (and its new value), what
# another person changes meanwhile (through the service the API calls), and that change's
# field and value, which must be kept.
CASES: dict[str, tuple[Callable, str, str, Callable, str, object]] = {
    "schedule": (
        a_schedule,
        "name",
        "renamed",
        lambda s: schedule_update(tenant=s.tenant_id, schedule_id=s.pk, data={"cron": "0 4 * * *"}),
        "cron",
        "0 4 * * *",
    ),
    "sector": (
        SectorFactory,
        "description",
        "described",
        lambda s: sector_update(sector_id=s.pk, data={"name": "Renamed"}, actor=None),
        "name",
        "Renamed",
    ),
    "automation": (
        AutomationWithWorkerFactory,
        "description",
        "described",
        lambda a: automation_update(automation_id=a.pk, data={"max_concurrency": 7}, actor=None),
        "max_concurrency",
        7,
    ),
    "webhookendpoint": (
        an_endpoint,
        "description",
        "described",
        lambda e: endpoint_update(
            tenant=e.tenant_id, endpoint_id=e.pk, data={"event_types": ["JobFailed"]}, actor=None
        ),
        "event_types",
        ["JobFailed"],
    ),
    "user": (
        lambda: UserFactory(role=User.Role.MEMBER),
        "full_name",
        "Ada Lovelace",
        lambda u: user_update(user=u, role=User.Role.MANAGER, actor=u),
        "role",
        User.Role.MANAGER,
    ),
}

PAGES = {
    "schedule": "/admin/schedule/schedule/{}/change/",
    "sector": "/admin/sector/sector/{}/change/",
    "automation": "/admin/automation/automation/{}/change/",
    "webhookendpoint": "/admin/webhook/webhookendpoint/{}/change/",
    "user": "/admin/identity/user/{}/change/",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_save_keeps_what_another_changed_since_the_page_was_opened(case, settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    make, edited, new_value, meanwhile, kept, kept_value = CASES[case]
    row = make()
    url = PAGES[case].format(row.pk)
    client = operator()
    form = opened(client, url)

    meanwhile(row)
    form[edited] = [new_value]
    response = client.post(url, form)

    assert response.status_code == 302, response.context["adminform"].form.errors
    row.refresh_from_db()
    assert getattr(row, edited) == new_value
    assert getattr(row, kept) == kept_value


@pytest.mark.parametrize(
    ("make", "page", "meanwhile", "field", "value"),
    [
        (
            SectorFactory,
            "/admin/sector/sector/{}/change/",
            lambda s: sector_update(sector_id=s.pk, data={"description": "second"}, actor=None),
            "description",
            "second",
        ),
        (
            TenantFactory,
            "/admin/identity/tenant/{}/change/",
            lambda t: tenant_rename(tenant=t, name="Renamed", actor=PlatformAdminFactory()),
            "name",
            "Renamed",
        ),
    ],
)
def test_a_page_saved_as_shown_sets_nothing_back(make, page, meanwhile, field, value):
    row = make()
    url = page.format(row.pk)
    client = operator()
    form = opened(client, url)
    meanwhile(row)
    row.refresh_from_db()
    changed_at = row.updated_at

    assert client.post(url, form).status_code == 302

    row.refresh_from_db()
    assert getattr(row, field) == value
    assert row.updated_at == changed_at
