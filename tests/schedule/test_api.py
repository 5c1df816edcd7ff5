"""The schedules API: managers manage their tenant's schedules, members read them."""

from __future__ import annotations

import threading
from datetime import datetime

import pytest
import time_machine
from django.db import connection

from automation.models import Automation
from common.errors import Conflict
from schedule.models import Schedule
from tests.clients import client_of
from tests.factories import AutomationFactory, ManagerFactory, TenantFactory, UserFactory
from tests.schedule.support import new_schedule, utc

pytestmark = pytest.mark.django_db

URL = "/api/v1/schedules"


def body(target, **fields):
    return {
        "name": "weekday mornings",
        "automation": target.pk,
        "cron": "0 6 * * 1-5",
        "timezone": "America/Sao_Paulo",
        "params": {"name": "Ada"},
        **fields,
    }


def test_a_manager_creates_a_schedule_and_sees_its_next_run(manager_api, manager, automation):
    with time_machine.travel(utc(2026, 6, 5, 12), tick=False):  # a Friday
        response = manager_api.post(URL, body(automation), format="json")

    assert response.status_code == 201, response.json()
    data = response.json()
    assert data["status"] == "active" and data["is_active"] is True
    assert data["misfire"] == "run_once"
    assert data["created_by"] == manager.pk
    # Monday 06:00 in São Paulo (-03, no daylight saving since 2019).
    assert datetime.fromisoformat(data["next_run_at"]) == utc(2026, 6, 8, 9, 0)
    assert Schedule.objects.get(pk=data["id"]).tenant_id == manager.tenant_id


def test_members_list_and_read_their_tenant_schedules_but_not_another_tenants(
    member_api, tenant, other_tenant, automation
):
    mine = new_schedule(tenant=tenant, automation=automation)
    theirs = new_schedule(tenant=other_tenant, automation=automation)

    listed = member_api.get(URL)
    read = member_api.get(f"{URL}/{mine.pk}")
    other = member_api.get(f"{URL}/{theirs.pk}")

    assert listed.status_code == 200
    assert [s["id"] for s in listed.json()["results"]] == [mine.pk]
    assert "next_run_at" in listed.json()["results"][0]
    assert read.status_code == 200 and read.json()["next_run_at"] is not None
    assert other.status_code == 404 and other.json()["error"]["code"] == "schedule_not_found"


@pytest.mark.parametrize(
    ("method", "path", "payload"),
    [
        ("post", "", None),
        ("patch", "/{id}", {"name": "x"}),
        ("post", "/{id}/pause", None),
        ("post", "/{id}/resume", None),
        ("post", "/{id}/deactivate", None),
    ],
)
def test_members_may_not_change_schedules(member_api, tenant, automation, method, path, payload):
    schedule = new_schedule(tenant=tenant, automation=automation)
    payload = body(automation) if payload is None and path == "" else payload

    response = getattr(member_api, method)(
        URL + path.format(id=schedule.pk), payload, format="json"
    )

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_a_manager_cannot_touch_another_tenants_schedule(manager_api, other_tenant, automation):
    theirs = new_schedule(tenant=other_tenant, automation=automation)

    for path in ("/pause", "/resume", "/deactivate"):
        response = manager_api.post(f"{URL}/{theirs.pk}{path}")
        assert response.status_code == 404, path
    assert manager_api.patch(f"{URL}/{theirs.pk}", {"name": "x"}, format="json").status_code == 404
    theirs.refresh_from_db()
    assert theirs.status == "active" and theirs.name == "nightly"


def test_people_without_a_tenant_and_strangers_are_refused(client, platform_admin):
    assert client.get(URL).status_code == 401
    assert client_of(platform_admin).get(URL).status_code == 403


@pytest.mark.parametrize(
    ("fields", "code", "field"),
    [
        ({"cron": "0 6 * *"}, "invalid_cron", "cron"),
        ({"cron": "0 6 * * * *"}, "invalid_cron", "cron"),
        ({"cron": "61 6 * * *"}, "invalid_cron", "cron"),
        ({"cron": "0 6 31 2 *"}, "invalid_cron", "cron"),
        ({"cron": "every day"}, "invalid_cron", "cron"),
        ({"timezone": "Mars/Olympus_Mons"}, "invalid_timezone", "timezone"),
        ({"timezone": "../../etc/passwd"}, "invalid_timezone", "timezone"),
        ({"timezone": ""}, "invalid", "timezone"),
        ({"params": {"name": 7}}, "invalid_params", "params"),
        ({"params": {}}, "invalid_params", "params"),
        ({"params": [1]}, "invalid_params", "params"),
        ({"misfire": "burst"}, "invalid", "misfire"),
        ({"automation": 999_999}, "unknown_automation", "automation"),
        ({"name": "x" * 201}, "invalid", "name"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(manager_api, automation, fields, code, field):
    response = manager_api.post(URL, body(automation, **fields), format="json")

    assert response.status_code == 400, response.json()
    assert response.json()["error"]["code"] == code
    assert field in response.json()["error"]["details"]
    assert not Schedule.objects.exists()


def test_a_bad_cron_and_a_bad_zone_at_once_name_both(manager_api, automation):
    response = manager_api.post(
        URL, body(automation, cron="x", timezone="Nowhere/Land"), format="json"
    )

    assert response.status_code == 400
    assert set(response.json()["error"]["details"]) == {"cron", "timezone"}
    # One of the documented codes (the zone's, read first), not a bare "invalid".
    assert response.json()["error"]["code"] == "invalid_timezone"


def test_a_bad_cron_and_a_bad_zone_in_an_update_name_both(manager_api, tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")

    response = manager_api.patch(
        f"{URL}/{schedule.pk}", {"cron": "x", "timezone": "Nowhere/Land"}, format="json"
    )

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_timezone"
    assert set(error["details"]) == {"cron", "timezone"}


def test_a_schedule_of_an_inactive_automation_is_refused(manager_api, automation):
    Automation.objects.filter(pk=automation.pk).update(is_active=False)

    response = manager_api.post(URL, body(automation), format="json")

    assert response.status_code == 409 and response.json()["error"]["code"] == "automation_inactive"


def test_an_update_of_the_calendar_moves_the_next_run(manager_api, tenant, automation):
    with time_machine.travel(utc(2026, 6, 1, 12), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation, cron="0 6 * * *")
        response = manager_api.patch(
            f"{URL}/{schedule.pk}",
            {"cron": "30  7 * * *", "timezone": "Europe/Lisbon", "misfire": "skip"},
            format="json",
        )

    assert response.status_code == 200, response.json()
    data = response.json()
    assert data["cron"] == "30 7 * * *" and data["misfire"] == "skip"
    assert datetime.fromisoformat(data["next_run_at"]) == utc(2026, 6, 2, 6, 30)  # WEST, +01


def test_an_update_with_bad_params_or_cron_is_a_400_and_changes_nothing(
    manager_api, tenant, automation
):
    schedule = new_schedule(tenant=tenant, automation=automation)

    bad_params = manager_api.patch(f"{URL}/{schedule.pk}", {"params": {"nom": 1}}, format="json")
    bad_cron = manager_api.patch(f"{URL}/{schedule.pk}", {"cron": "* *"}, format="json")

    assert bad_params.status_code == 400 and bad_params.json()["error"]["code"] == "invalid_params"
    assert bad_cron.status_code == 400 and bad_cron.json()["error"]["code"] == "invalid_cron"
    schedule.refresh_from_db()
    assert schedule.params == {"name": "Ada"} and schedule.cron == "0 6 * * *"


def test_pause_and_resume(manager_api, tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)

    paused = manager_api.post(f"{URL}/{schedule.pk}/pause")
    again = manager_api.post(f"{URL}/{schedule.pk}/pause")
    resumed = manager_api.post(f"{URL}/{schedule.pk}/resume")

    assert paused.status_code == 200
    assert paused.json()["status"] == "paused" and paused.json()["next_run_at"] is None
    assert paused.json()["paused_reason"] == "Paused by a manager."
    assert again.status_code == 200 and again.json()["paused_at"] == paused.json()["paused_at"]
    assert resumed.status_code == 200
    assert resumed.json()["status"] == "active" and resumed.json()["paused_reason"] == ""
    assert resumed.json()["next_run_at"] is not None


def test_a_schedule_paused_for_its_params_shows_why_and_resumes_once_they_are_fixed(
    manager_api, member_api, tenant, automation
):
    from schedule.firing import schedules_fire_due

    with time_machine.travel(utc(2026, 6, 1, 5), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation)
    Automation.objects.filter(pk=automation.pk).update(
        params_schema={"type": "object", "required": ["city"]}
    )
    schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 5))

    seen = member_api.get(f"{URL}/{schedule.pk}").json()
    refused = manager_api.post(f"{URL}/{schedule.pk}/resume")
    fixed = manager_api.patch(f"{URL}/{schedule.pk}", {"params": {"city": "Recife"}}, format="json")
    resumed = manager_api.post(f"{URL}/{schedule.pk}/resume")

    assert seen["status"] == "paused" and "city" in seen["paused_reason"]
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_params"
    assert fixed.status_code == 200 and fixed.json()["status"] == "paused"
    assert resumed.status_code == 200 and resumed.json()["status"] == "active"


def test_deactivate_is_for_good_and_delete_is_refused(manager_api, tenant, automation):
    schedule = new_schedule(tenant=tenant, automation=automation)

    deleted = manager_api.delete(f"{URL}/{schedule.pk}")
    deactivated = manager_api.post(f"{URL}/{schedule.pk}/deactivate")
    again = manager_api.post(f"{URL}/{schedule.pk}/deactivate")
    resumed = manager_api.post(f"{URL}/{schedule.pk}/resume")
    changed = manager_api.patch(f"{URL}/{schedule.pk}", {"name": "x"}, format="json")

    assert deleted.status_code == 405 and "deactivate" in deleted.json()["error"]["message"]
    assert deactivated.status_code == 200
    assert deactivated.json()["status"] == "deactivated"
    assert deactivated.json()["next_run_at"] is None
    assert deactivated.json()["deactivated_at"] is not None
    for refused in (again, resumed, changed):
        assert refused.status_code == 409 and refused.json()["error"]["code"] == "schedule_inactive"
    assert Schedule.objects.filter(pk=schedule.pk).exists()


def test_the_list_filters_by_automation_and_activity(member_api, tenant, automation):
    other_automation = AutomationFactory()
    first = new_schedule(tenant=tenant, automation=automation)
    second = new_schedule(tenant=tenant, automation=other_automation)
    manager_api = client_of(ManagerFactory(tenant=tenant))
    manager_api.post(f"{URL}/{second.pk}/deactivate")

    by_automation = member_api.get(URL, {"automation": automation.pk}).json()["results"]
    active = member_api.get(URL, {"active": "true"}).json()["results"]
    bad = member_api.get(URL, {"active": "maybe"})

    assert [s["id"] for s in by_automation] == [first.pk]
    assert [s["id"] for s in active] == [first.pk]
    assert bad.status_code == 400


def test_a_member_of_an_inactive_tenant_is_refused(tenant, automation):
    person = UserFactory(tenant=tenant)
    tenant.is_active = False
    tenant.save(update_fields=["is_active"])

    assert client_of(person).get(URL).status_code in (401, 403)


def test_a_scheduled_job_reads_as_triggered_by_its_schedule_and_due_time(
    member_api, member, tenant, automation
):
    from schedule.firing import schedules_fire_due
    from tests.factories import JobFactory

    with time_machine.travel(utc(2026, 6, 1, 5), tick=False):
        schedule = new_schedule(tenant=tenant, automation=automation)
    (job_id,) = schedules_fire_due(now=utc(2026, 6, 1, 6, 0, 5)).started
    asked = JobFactory(tenant=tenant, automation=automation, requested_by=member)

    scheduled = member_api.get(f"/api/v1/jobs/{job_id}").json()
    by_a_person = member_api.get(f"/api/v1/jobs/{asked.pk}").json()

    assert scheduled["triggered_by"] == {
        "schedule": schedule.pk,
        "due_at": "2026-06-01T06:00:00+00:00",
    }
    assert scheduled["requested_by"] is None
    assert by_a_person["triggered_by"] is None


def test_an_unnamed_schedule_is_known_by_its_expression(manager_api, automation):
    payload = body(automation, cron="15 4 * * *")
    del payload["name"]

    response = manager_api.post(URL, payload, format="json")

    assert response.status_code == 201, response.json()
    assert response.json()["name"] == "15 4 * * *"


# --- calendars at the door --------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_a_chatham_schedule_created_inside_its_repeated_hour_answers_at_once(
    manager_api, automation
):
    # 13:45:30Z is 03:30:30 +13:45 on 2027-04-04, just before 03:45 becomes 02:45 again.
    with time_machine.travel(utc(2027, 4, 3, 13, 45, 30), tick=False):
        response = manager_api.post(
            URL, body(automation, cron="*/15 3 * * *", timezone="Pacific/Chatham"), format="json"
        )

    assert response.status_code == 201, response.json()
    assert response.json()["next_run_at"] == "2027-04-03T14:15:00Z"


@pytest.mark.parametrize(
    ("cron", "zone", "reason"),
    [
        ("0 0 30 2 *", "UTC", "no due time"),
        ("*/15 2 8-14 3 */7", "America/New_York", "no due time"),
        ("0 0 * * 5#3", "UTC", "'#'"),
        ("@daily", "UTC", "0 0 * * *"),
        ("10-5 * * * *", "UTC", "backwards"),
    ],
)
def test_a_calendar_without_a_due_time_or_that_cron_does_not_read_is_a_400(
    manager_api, automation, cron, zone, reason
):
    response = manager_api.post(URL, body(automation, cron=cron, timezone=zone), format="json")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_cron" and reason in error["message"]
    assert reason in error["details"]["cron"][0]
    assert not Schedule.objects.exists()


def test_a_new_zone_that_leaves_the_expression_without_a_due_time_is_refused(
    manager_api, tenant, automation
):
    schedule = new_schedule(tenant=tenant, automation=automation, cron="*/15 2 8-14 3 */7")

    moved = manager_api.patch(
        f"{URL}/{schedule.pk}", {"timezone": "America/New_York"}, format="json"
    )

    assert moved.status_code == 400 and moved.json()["error"]["code"] == "invalid_cron"
    schedule.refresh_from_db()
    assert schedule.timezone == "UTC"


@pytest.mark.parametrize("zone", ["localtime", "posixrules", "Factory", "posix/UTC"])
def test_files_of_the_zone_database_that_are_not_zones_are_refused(manager_api, automation, zone):
    response = manager_api.post(URL, body(automation, timezone=zone), format="json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid_timezone"


def test_resuming_a_schedule_whose_calendar_has_no_due_time_left_is_a_400(
    manager_api, tenant, automation
):
    schedule = new_schedule(tenant=tenant, automation=automation)
    manager_api.post(f"{URL}/{schedule.pk}/pause")
    Schedule.objects.filter(pk=schedule.pk).update(
        cron="*/15 2 8-14 3 */7", timezone="America/New_York"
    )

    resumed = manager_api.post(f"{URL}/{schedule.pk}/resume")

    assert resumed.status_code == 400
    assert resumed.json()["error"]["code"] == "invalid_cron"
    assert "no due time" in resumed.json()["error"]["message"]
    schedule.refresh_from_db()
    assert schedule.status == "paused"


def test_resuming_a_schedule_whose_zone_this_server_cannot_read_names_the_zone(
    manager_api, tenant, automation
):
    # A zone taken when it was created, gone from the server's zone database since (an
    # older tzdata on a new host, say): the calendar is fine, the zone is not.
    schedule = new_schedule(tenant=tenant, automation=automation)
    manager_api.post(f"{URL}/{schedule.pk}/pause")
    Schedule.objects.filter(pk=schedule.pk).update(timezone="Mars/Olympus_Mons")

    resumed = manager_api.post(f"{URL}/{schedule.pk}/resume")

    assert resumed.status_code == 400
    error = resumed.json()["error"]
    assert error["code"] == "invalid_timezone"
    assert "Mars/Olympus_Mons" in error["details"]["timezone"][0]
    schedule.refresh_from_db()
    assert schedule.status == "paused"


# --- the tenant's limit -----------------------------------------------------------------------


def test_a_tenant_at_its_limit_of_schedules_is_refused_until_it_deactivates_one(
    manager_api, tenant, automation, settings
):
    settings.SCHEDULE_MAX_PER_TENANT = 3
    first, *_ = [new_schedule(tenant=tenant, automation=automation) for _ in range(2)]
    paused = new_schedule(tenant=tenant, automation=automation)
    manager_api.post(f"{URL}/{paused.pk}/pause")

    refused = manager_api.post(URL, body(automation), format="json")
    manager_api.post(f"{URL}/{first.pk}/deactivate")
    accepted = manager_api.post(URL, body(automation), format="json")

    assert refused.status_code == 409
    assert refused.json()["error"]["code"] == "schedule_limit_reached"
    assert refused.json()["error"]["details"] == {"limit": 3}
    assert accepted.status_code == 201
    assert Schedule.objects.filter(tenant=tenant, is_active=True).count() == 3


def test_another_tenants_schedules_do_not_count(manager_api, automation, settings):
    settings.SCHEDULE_MAX_PER_TENANT = 1
    new_schedule(tenant=TenantFactory(), automation=automation)

    assert manager_api.post(URL, body(automation), format="json").status_code == 201


@pytest.mark.django_db(transaction=True)
def test_creations_racing_for_the_last_places_never_pass_the_limit(tenant, automation, settings):
    settings.SCHEDULE_MAX_PER_TENANT = 4
    new_schedule(tenant=tenant, automation=automation)
    threads = 8
    start = threading.Barrier(threads)
    outcomes: list[str] = []

    def create() -> None:
        try:
            start.wait()
            new_schedule(tenant=tenant, automation=automation)
            outcomes.append("created")
        except Conflict as refusal:
            outcomes.append(refusal.code)
        finally:
            connection.close()

    workers = [threading.Thread(target=create) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert sorted(outcomes) == ["created"] * 3 + ["schedule_limit_reached"] * 5
    assert Schedule.objects.filter(tenant=tenant, is_active=True).count() == 4
