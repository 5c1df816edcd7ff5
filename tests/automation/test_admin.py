"""The automation admin: the worker inline, one transaction, the same events as the API."""

from __future__ import annotations

import re

import pytest
from rest_framework.exceptions import AuthenticationFailed

from automation.models import Automation, Worker
from outbox.models import Event
from tests.automation.test_services import authenticate
from tests.factories import AutomationWithWorkerFactory, SectorFactory

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/automation/automation/"
CREDENTIAL = re.compile(r"<code>(hdw_[A-Za-z0-9_\-]+)</code>")


def form_data(sector, *, worker_id="", automation_id="", **overrides) -> dict[str, str]:
    """The automation's fields and the worker inline, management form included."""
    data = {
        "name": "Invoice export",
        "slug": "invoice-export",
        "description": "",
        "sector": str(sector.id),
        "command": '["python", "export.py"]',
        "max_concurrency": "2",
        "timeout_seconds": "600",
        "max_attempts": "1",
        "params_schema": '{"type": "object"}',
        "worker-TOTAL_FORMS": "1",
        "worker-INITIAL_FORMS": "1" if worker_id else "0",
        "worker-MIN_NUM_FORMS": "1",
        "worker-MAX_NUM_FORMS": "1",
        "worker-0-provider": "ec2",
        "worker-0-machine_id": "i-0123456789abcdef0",
        "worker-0-region": "sa-east-1",
        "worker-0-id": str(worker_id),
        "worker-0-automation": str(automation_id),
    }
    data.update(overrides)
    return data


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


def test_the_changelist_loads_with_filters_and_search(admin_site, automation):
    AutomationWithWorkerFactory(name="Route planner")

    response = admin_site.get(
        CHANGELIST, {"q": automation.name, "is_active__exact": "1", "worker__provider": "local"}
    )

    assert response.status_code == 200
    assert response.context["cl"].result_count == 1
    actions = dict(response.context["action_form"].fields["action"].choices)
    assert {"deactivate_selected", "rotate_worker_credential"} <= set(actions)
    assert "delete_selected" not in actions


def test_the_add_page_shows_the_worker_inline(admin_site, sector):
    response = admin_site.get(f"{CHANGELIST}add/")

    assert response.status_code == 200
    (formset,) = response.context["inline_admin_formsets"]
    assert formset.formset.prefix == "worker"
    assert 'name="worker-TOTAL_FORMS"' in response.content.decode()


def test_adding_creates_automation_and_worker_with_the_api_events_and_shows_the_credential_once(
    admin_site, platform_admin, sector, events
):
    response = admin_site.post(f"{CHANGELIST}add/", form_data(sector), follow=True)

    assert response.status_code == 200
    automation = Automation.objects.get()
    worker = Worker.objects.get(automation=automation)
    assert (automation.max_concurrency, automation.command) == (2, ["python", "export.py"])
    assert worker.machine() == ("ec2", "i-0123456789abcdef0", "sa-east-1")
    assert events() == ["AutomationCreated", "WorkerRegistered"]
    assert {e.actor for e in Event.objects.all()} == {f"user:{platform_admin.id}"}
    assert Event.objects.get(type="AutomationCreated").payload["automation_id"] == automation.id

    (credential,) = CREDENTIAL.findall(" ".join(messages_of(response)))
    assert authenticate(credential)[0] == worker
    # Shown once: the next page does not carry it.
    assert credential not in admin_site.get(f"{CHANGELIST}{automation.id}/change/").content.decode()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"command": "[]"}, "command"),
        ({"command": '["python", ""]'}, "command"),
        ({"params_schema": '{"type": "no-such-type"}'}, "params_schema"),
        ({"max_concurrency": "0"}, "max_concurrency"),
        ({"timeout_seconds": "0"}, "timeout_seconds"),
        # JSON text in a form can spell what PostgreSQL and UTF-8 cannot hold.
        ({"command": '["python", "\\ud800"]'}, "command"),
        ({"params_schema": '{"title": "\\u0000"}'}, "params_schema"),
        ({"params_schema": '{"properties": {"\\udfff": {}}}'}, "params_schema"),
    ],
)
def test_invalid_automation_input_is_a_form_error_and_writes_nothing(
    admin_site, sector, events, overrides, field
):
    response = admin_site.post(f"{CHANGELIST}add/", form_data(sector, **overrides))

    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Automation.objects.exists() and events() == []


def test_a_retired_sector_cannot_be_chosen(admin_site, events):
    retired = SectorFactory(is_active=False)

    response = admin_site.post(f"{CHANGELIST}add/", form_data(retired))

    assert response.status_code == 200
    assert "sector" in response.context["adminform"].form.errors
    assert not Automation.objects.exists() and events() == []


def test_an_invalid_machine_is_an_inline_error_and_writes_nothing(admin_site, sector, events):
    response = admin_site.post(
        f"{CHANGELIST}add/", form_data(sector, **{"worker-0-machine_id": "web-1"})
    )

    assert response.status_code == 200
    (formset,) = response.context["inline_admin_formsets"]
    assert "machine_id" in formset.formset.forms[0].errors
    assert not Automation.objects.exists() and events() == []


def test_changing_the_machine_on_the_change_page_re_registers_the_worker(
    admin_site, automation, events
):
    worker = automation.worker
    url = f"{CHANGELIST}{automation.id}/change/"
    assert admin_site.get(url).status_code == 200
    data = form_data(
        automation.sector,
        worker_id=worker.id,
        automation_id=automation.id,
        name=automation.name,
        slug=automation.slug,
        command='["python", "-c", "print(\'ok\')"]',
        max_concurrency=str(automation.max_concurrency),
        timeout_seconds=str(automation.timeout_seconds),
        max_attempts=str(automation.max_attempts),
        params_schema="null",
    )

    response = admin_site.post(url, data)

    assert response.status_code == 302, response.context["adminform"].form.errors
    worker.refresh_from_db()
    assert worker.machine() == ("ec2", "i-0123456789abcdef0", "sa-east-1")
    assert events() == ["WorkerRegistered"]

    data["max_concurrency"] = "5"
    assert admin_site.post(url, data).status_code == 302
    assert Automation.objects.get().max_concurrency == 5
    assert events() == ["WorkerRegistered", "AutomationUpdated"]


def test_the_deactivate_action_retires_automation_and_worker(admin_site, automation, events):
    response = admin_site.post(
        CHANGELIST,
        {"action": "deactivate_selected", "_selected_action": [automation.id]},
        follow=True,
    )

    assert response.status_code == 200
    assert not Automation.objects.get().is_active
    assert Worker.objects.get().status == Worker.Status.DEACTIVATED
    assert events() == ["AutomationDeactivated", "WorkerDeactivated"]


def test_the_rotate_action_shows_a_new_credential_once_and_the_old_one_stops_working(
    admin_site, automation
):
    response = admin_site.post(
        CHANGELIST,
        {"action": "rotate_worker_credential", "_selected_action": [automation.id]},
        follow=True,
    )

    (credential,) = CREDENTIAL.findall(" ".join(messages_of(response)))
    assert authenticate(credential)[0].automation_id == automation.id
    with pytest.raises(AuthenticationFailed):
        authenticate(automation.credential)
    assert credential not in admin_site.get(CHANGELIST).content.decode()


def test_automations_cannot_be_deleted_in_the_admin(admin_site, automation):
    url = f"{CHANGELIST}{automation.id}/delete/"

    assert admin_site.get(url).status_code == 403
    assert admin_site.post(url, {"post": "yes"}).status_code == 403
    assert Automation.objects.filter(pk=automation.pk).exists()


def test_a_local_worker_left_as_proposed_is_created_with_the_automation(admin_site, sector, events):
    data = form_data(
        sector, **{"worker-0-provider": "local", "worker-0-machine_id": "", "worker-0-region": ""}
    )

    response = admin_site.post(f"{CHANGELIST}add/", data)

    assert response.status_code == 302
    assert Worker.objects.get().machine() == ("local", "", "")
    assert events() == ["AutomationCreated", "WorkerRegistered"]
