"""What the admin must refuse, as a refusal and not a 500 (nor a change it may not make): an
action a view-only operator is not allowed, a JSON number jsonb cannot hold, an automation
posted without its worker, a NUL in a page's path, a list query the database cannot run,
an action over ids of no row, the "view on site" redirect."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.test import Client

from automation.models import Automation
from identity.models import Tenant, User
from outbox.models import TaskRun
from schedule.models import Schedule
from tests.automation.test_admin import form_data
from tests.factories import (
    AutomationWithWorkerFactory,
    SectorFactory,
    TenantFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


def viewer_of(*codenames: str) -> Client:
    staff = UserFactory(tenant=None, is_staff=True)
    staff.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client(raise_request_exception=False)
    client.force_login(staff)
    return client


@pytest.mark.parametrize(
    ("url", "codename", "make", "model"),
    [
        ("/admin/identity/tenant/", "view_tenant", TenantFactory, Tenant),
        ("/admin/identity/user/", "view_user", UserFactory, User),
    ],
)
def test_a_view_only_operator_cannot_deactivate(url, codename, make, model):
    row = make()
    viewer = viewer_of(codename)

    shown = viewer.get(url)
    response = viewer.post(
        url, {"action": "deactivate", "index": "0", "_selected_action": [row.pk]}
    )

    assert shown.status_code == 200
    action_form = shown.context["action_form"]  # None: no action offered at all
    assert action_form is None or "deactivate" not in dict(action_form.fields["action"].choices)
    assert response.status_code in (200, 302)
    assert model.objects.get(pk=row.pk).is_active


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_schedule_params_with_a_number_jsonb_cannot_hold_are_a_form_error(admin_client, number):
    automation = AutomationWithWorkerFactory()
    tenant = TenantFactory()

    response = admin_client.post(
        "/admin/schedule/schedule/add/",
        {
            "tenant": tenant.pk,
            "automation": automation.pk,
            "name": "Nightly",
            "cron": "0 3 * * *",
            "timezone": "UTC",
            "params": f'{{"limit": {number}}}',
            "misfire": "run_once",
        },
    )

    assert response.status_code == 200, response.status_code
    errors = response.context["adminform"].form.errors
    assert "params" in errors, errors
    assert "finite" in str(errors["params"])
    assert not Schedule.objects.exists()


@pytest.mark.parametrize("forms", ["0", "-1"])
def test_an_automation_posted_without_its_worker_is_a_form_error(admin_client, forms):
    sector = SectorFactory()

    response = admin_client.post(
        "/admin/automation/automation/add/", form_data(sector, **{"worker-TOTAL_FORMS": forms})
    )

    assert response.status_code == 200, response.status_code
    assert "exactly one worker" in response.content.decode()
    assert not Automation.objects.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/admin/relay/relayschedule/a%00b/change/",
        "/admin/identity/tenant/%00/history/",
        "/api/v1/jobs/%00",
    ],
)
def test_a_nul_in_the_path_is_a_400(admin_client, path):
    response = admin_client.get(path)

    assert response.status_code == 400
    assert list(response.json()["error"]["details"]) == ["path"]


@pytest.mark.parametrize(
    ("url", "query"),
    [
        ("/admin/identity/tenant/", {"name__regex": "("}),
        ("/admin/identity/tenant/", {"id__range": "1"}),
        ("/admin/identity/tenant/", {"created_at__year": "99999"}),
        ("/admin/job/job/", {"params__regex": "("}),
        ("/admin/webhook/webhookendpoint/", {"event_types": "abc"}),
        ("/admin/outbox/taskrun/", {"task__regex": "("}),
        ("/admin/webhook/webhookdelivery/", {"id__range": "1"}),
        ("/admin/auth/group/", {"name__regex": "("}),
    ],
)
def test_a_list_query_the_database_cannot_run_is_the_admins_bad_parameters_answer(
    admin_client, url, query
):
    TenantFactory()

    response = admin_client.get(url, query)

    assert response.status_code == 302, response.status_code
    assert response["Location"].endswith("?e=1")


@pytest.mark.parametrize(
    ("url", "action", "selected"),
    [
        ("/admin/identity/tenant/", "deactivate", "abc"),
        ("/admin/identity/tenant/", "deactivate", "1.5"),
        ("/admin/identity/tenant/", "deactivate", ""),
        ("/admin/outbox/taskrun/", "requeue", "1"),
        ("/admin/auth/group/", "delete_selected", "abc"),
    ],
)
def test_an_action_over_ids_of_no_row_changes_nothing(admin_client, url, action, selected):
    tenant = TenantFactory()

    response = admin_client.post(
        url, {"action": action, "index": "0", "_selected_action": [selected]}, follow=True
    )

    assert response.status_code == 200
    shown = [str(message) for message in response.context["messages"]]
    assert any("Items must be selected" in message for message in shown), shown
    assert Tenant.objects.get(pk=tenant.pk).is_active


def test_the_view_on_site_redirect_is_a_404(admin_client):
    run_type = ContentType.objects.get_for_model(TaskRun)

    response = admin_client.get(f"/admin/r/{run_type.pk}/abc/")

    assert response.status_code == 404
