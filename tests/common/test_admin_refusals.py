"""What the admin must refuse, as a refusal and not a 500 (nor a change it may not make): an
action a view-only operator is not allowed, a JSON number jsonb cannot hold, an automation
posted without its worker, a NUL in a page's path."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Permission
from django.test import Client

from automation.models import Automation
from identity.models import Tenant, User
from schedule.models import Schedule
from tests.automation.test_admin import form_data
from tests.factories import (
    AutomationWithWorkerFactory,
    PlatformAdminFactory,
    SectorFactory,
    TenantFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    client = Client(raise_request_exception=False)
    client.force_login(PlatformAdminFactory())
    return client


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
