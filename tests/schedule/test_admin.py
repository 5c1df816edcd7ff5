"""The schedules admin: the API's checks on its form, the services behind it, no deletes."""

from __future__ import annotations

import pytest
import time_machine

from schedule.firing import schedules_fire_due
from schedule.models import Schedule
from tests.schedule.support import new_schedule, utc

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/schedule/schedule/"


def form_data(tenant, automation, **fields):
    return {
        "tenant": tenant.pk,
        "automation": automation.pk,
        "name": "nightly",
        "cron": "0 3 * * *",
        "timezone": "Europe/Lisbon",
        "params": '{"name": "Ada"}',
        "misfire": "run_once",
        **fields,
    }


def test_the_changelist_loads_with_its_actions_and_no_delete(admin_site, tenant, automation):
    new_schedule(tenant=tenant, automation=automation)

    response = admin_site.get(CHANGELIST)

    assert response.status_code == 200
    actions = dict(response.context["action_form"].fields["action"].choices)
    assert {"pause_selected", "resume_selected", "deactivate_selected"} <= set(actions)
    assert "delete_selected" not in actions


def test_adding_a_schedule_goes_through_the_service(admin_site, platform_admin, tenant, automation):
    assert admin_site.get(f"{CHANGELIST}add/").status_code == 200

    response = admin_site.post(f"{CHANGELIST}add/", form_data(tenant, automation))

    assert response.status_code == 302, response.context["adminform"].form.errors
    schedule = Schedule.objects.get()
    assert schedule.next_run_at is not None and schedule.created_by_id == platform_admin.pk
    assert schedule.params == {"name": "Ada"}


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"cron": "0 3 * *"}, "cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"params": '{"name": 1}'}, "params"),
        # Nested past the API's bound (100 levels), and past what Python's parser can read.
        ({"params": '{"a": ' + "[" * 150 + "]" * 150 + "}"}, "params"),
        ({"params": '{"a": ' + "[" * 100_000 + "]" * 100_000 + "}"}, "params"),
    ],
    ids=["cron", "timezone", "params", "params-deep", "params-too-deep-to-parse"],
)
def test_bad_input_is_a_form_error_on_its_field(admin_site, tenant, automation, fields, field):
    response = admin_site.post(f"{CHANGELIST}add/", form_data(tenant, automation, **fields))

    assert response.status_code == 200
    assert field in response.context["adminform"].form.errors
    assert not Schedule.objects.exists()


def test_the_pause_action_pauses_through_the_service(admin_site, tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)

    response = admin_site.post(
        CHANGELIST, {"action": "pause_selected", "_selected_action": [schedule.pk]}
    )

    assert response.status_code == 302
    schedule.refresh_from_db()
    assert schedule.status == "paused" and schedule.next_run_at is None
    assert admin_site.get(f"{CHANGELIST}{schedule.pk}/change/").status_code == 200


def test_the_change_page_shows_the_recent_runs(admin_site, tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation)
    (job_id,) = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 5)).started

    response = admin_site.get(f"{CHANGELIST}{schedule.pk}/change/")

    assert response.status_code == 200
    assert f"2026-06-01T06:00:00+00:00: job {job_id}" in response.content.decode()


def test_a_job_a_schedule_started_links_to_it_and_back(admin_site, tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 5), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation)
    (job_id,) = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 5)).started

    job_page = admin_site.get(f"/admin/job/job/{job_id}/change/").content.decode()
    schedule_page = admin_site.get(f"{CHANGELIST}{schedule.pk}/change/").content.decode()

    assert (
        f'started by schedule <a href="{CHANGELIST}{schedule.pk}/change/">nightly</a> '
        "(due 2026-06-01 06:00:00 UTC)" in job_page
    )
    assert f'job {job_id} (<a href="/admin/job/job/{job_id}/change/">its page</a>)' in schedule_page


def test_the_state_filter_lists_the_paused_with_their_reason(admin_site, tenant, automation):
    paused = new_schedule(tenant=tenant, automation=automation, name="paused one")
    new_schedule(tenant=tenant, automation=automation, name="running one")
    admin_site.post(CHANGELIST, {"action": "pause_selected", "_selected_action": [paused.pk]})

    response = admin_site.get(CHANGELIST, {"state": "paused"})

    assert [s.pk for s in response.context["cl"].result_list] == [paused.pk]
    assert "paused one" in response.content.decode()
