"""The admin site itself: its name, where "View site" leads, empty JSON fields, schedules."""

from __future__ import annotations

import pytest
from django.utils import timezone

from relay.models import RelaySchedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_site(client, platform_admin):
    client.force_login(platform_admin)
    return client


def test_the_site_is_hub_dommed_and_view_site_leads_to_the_api_docs(admin_site):
    page = admin_site.get("/admin/").content.decode()

    assert "<title>Site administration | Hub DomMed admin</title>" in page or "Hub DomMed" in page
    assert '<a href="/admin/">Hub DomMed</a>' in page
    assert '<a href="/api/docs/">View site</a>' in page


def test_json_fields_start_empty_with_their_shape_in_the_help(admin_site):
    page = admin_site.get("/admin/automation/automation/add/").content.decode()

    assert ">null</textarea>" not in page
    assert 'name="params_schema"' in page
    assert "A JSON Schema object" in page
    assert "JSON array of strings" in page


def test_schedules_are_listed_and_made_due_through_the_service(admin_site):
    later = timezone.now() + timezone.timedelta(hours=1)
    RelaySchedule.objects.create(name="maintenance.purge.hourly", next_due_at=later)

    response = admin_site.post(
        "/admin/relay/relayschedule/",
        {"action": "make_due", "_selected_action": ["maintenance.purge.hourly"]},
        follow=True,
    )

    assert "1 schedule(s) due now." in [str(m) for m in response.context["messages"]]
    assert RelaySchedule.objects.get().next_due_at <= timezone.now()
    assert admin_site.get("/admin/relay/relayschedule/add/").status_code == 403
