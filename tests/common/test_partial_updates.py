"""A partial update (PATCH) that names no field the resource has changes nothing, so it is
a 400 that says which fields there are (and which keys were not fields), never a 200 that
silently did nothing: a typo of a field's name is caught."""

from __future__ import annotations

import pytest
from django.test import Client

from schedule.services import schedule_create
from tests.factories import (
    AutomationWithWorkerFactory,
    ManagerFactory,
    PlatformAdminFactory,
    SectorFactory,
    UserFactory,
    bearer,
)
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def world():
    admin = PlatformAdminFactory()
    manager = ManagerFactory()
    automation = AutomationWithWorkerFactory()
    schedule = schedule_create(
        tenant=manager.tenant,
        actor=manager,
        automation_id=automation.pk,
        name="nightly",
        cron="0 6 * * *",
    )
    endpoint = endpoint_create(
        tenant=manager.tenant,
        url="https://hooks.example.com/hub",
        event_types=["JobCompleted"],
        actor=manager,
    )
    member = UserFactory(tenant=manager.tenant)
    return {
        "sectors": (f"/api/v1/sectors/{SectorFactory().pk}", admin),
        "automations": (f"/api/v1/automations/{automation.pk}", admin),
        "schedules": (f"/api/v1/schedules/{schedule.pk}", manager),
        "webhooks": (f"/api/v1/webhooks/{endpoint.pk}", manager),
        "users": (f"/api/v1/users/{member.pk}", manager),
    }


def patch(path: str, person, body: dict):
    return Client(raise_request_exception=False).patch(
        path, body, content_type="application/json", HTTP_AUTHORIZATION=bearer(person)
    )


RESOURCES = ["sectors", "automations", "schedules", "webhooks", "users"]


@pytest.mark.parametrize("resource", RESOURCES)
def test_a_patch_of_only_unknown_keys_is_a_400_naming_them(world, resource):
    path, person = world[resource]

    response = patch(path, person, {"descriptio": "a typo"})

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid"
    (message,) = [m for messages in error["details"].values() for m in messages]
    assert "descriptio" in message and "Give at least one of" in message


@pytest.mark.parametrize("resource", RESOURCES)
def test_an_empty_patch_is_a_400(world, resource):
    path, person = world[resource]

    response = patch(path, person, {})

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid"


@pytest.mark.parametrize("resource", ["sectors", "automations", "schedules", "webhooks"])
def test_a_patch_with_a_known_field_is_applied(world, resource):
    path, person = world[resource]
    field = "name" if resource in ("sectors", "automations", "schedules") else "description"

    response = patch(path, person, {field: "renamed", "unknown": 1})

    assert response.status_code == 200, response.content
    assert response.json()[field] == "renamed"


@pytest.mark.parametrize("body", [{"worker": {}}, {"worker": {"machineid": "i-typo"}}])
def test_a_nested_part_that_names_no_field_is_a_400(world, body):
    path, person = world["automations"]

    response = patch(path, person, body)

    assert response.status_code == 400, response.content
    assert "worker" in response.json()["error"]["details"]
