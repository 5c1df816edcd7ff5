"""The automations API: created with their worker, the credential shown once."""

from __future__ import annotations

import pytest
from rest_framework.exceptions import AuthenticationFailed

from automation.authentication import hash_credential
from automation.models import Automation, Worker
from tests.automation.test_services import authenticate
from tests.factories import AutomationWithWorkerFactory, SectorFactory

pytestmark = pytest.mark.django_db


def payload(target_sector, **overrides):
    return {
        "name": "Invoice export",
        "sector": target_sector.id,
        "command": ["python", "export.py", "--month"],
        "max_concurrency": 2,
        "params_schema": {"type": "object", "properties": {"month": {"type": "string"}}},
        "worker": {"provider": "ec2", "machine_id": "i-0123456789abcdef0", "region": "sa-east-1"},
        **overrides,
    }


def test_creating_returns_the_automation_and_its_worker_credential_once(admin_api, sector, events):
    response = admin_api.post("/api/v1/automations", payload(sector), format="json")

    assert response.status_code == 201
    body = response.json()
    credential = body["worker"]["credential"]
    worker = Worker.objects.get(automation_id=body["id"])
    assert worker.credential_hash == hash_credential(credential)
    assert body["worker"]["machine_id"] == "i-0123456789abcdef0"
    assert (body["slug"], body["sector"], body["max_concurrency"]) == (
        "invoice-export",
        sector.id,
        2,
    )
    assert events() == ["AutomationCreated", "WorkerRegistered"]
    # Never again: reading it back shows no credential.
    again = admin_api.get(f"/api/v1/automations/{body['id']}").json()
    assert "credential" not in again["worker"]
    assert credential not in str(again)


def test_the_worker_defaults_to_a_local_process(admin_api, sector):
    body = payload(sector)
    del body["worker"]

    response = admin_api.post("/api/v1/automations", body, format="json")

    assert response.status_code == 201
    assert response.json()["worker"]["provider"] == "local"


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"command": []}, "command"),
        ({"command": ["python", ""]}, "command"),
        ({"command": "python export.py"}, "command"),
        ({"params_schema": {"type": "nothing-like-this"}}, "params_schema"),
        ({"sector": 999_999}, "sector"),
        ({"sector": None}, "sector"),
        ({"name": ""}, "name"),
        ({"worker": {"provider": "ec2", "machine_id": "web-1"}}, "machine_id"),
        ({"worker": {"provider": "gcp"}}, "worker"),
        ({"max_concurrency": "many"}, "max_concurrency"),
        # PostgreSQL's jsonb cannot hold U+0000: refused here, not a 500 at the INSERT.
        ({"params_schema": {"type": "object", "title": "a\u0000b"}}, "params_schema"),
        ({"params_schema": {"type": "object", "properties": {"\u0000": {}}}}, "params_schema"),
        # The hub never fetches a schema from elsewhere, and a reference must lead somewhere.
        ({"params_schema": {"$ref": "http://127.0.0.1:9/schema.json"}}, "params_schema"),
        ({"params_schema": {"properties": {"a": {"$ref": "other.json"}}}}, "params_schema"),
        ({"params_schema": {"properties": {"a": {"$ref": "#/$defs/missing"}}}}, "params_schema"),
        ({"params_schema": {"$dynamicRef": "#nowhere"}}, "params_schema"),
    ],
)
def test_invalid_input_is_a_400_in_the_error_format(admin_api, sector, events, overrides, field):
    response = admin_api.post("/api/v1/automations", payload(sector, **overrides), format="json")

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert error["message"]
    assert field in error["details"]
    assert not Automation.objects.exists() and events() == []


def test_a_schema_may_refer_to_its_own_definitions(admin_api, sector):
    schema = {
        "$id": "https://schemas.example.com/invoice",
        "$defs": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}},
        "type": "object",
        "properties": {
            "month": {"$ref": "#/$defs/month"},
            "again": {"$ref": "https://schemas.example.com/invoice#/$defs/month"},
        },
    }

    response = admin_api.post(
        "/api/v1/automations", payload(sector, params_schema=schema), format="json"
    )

    assert response.status_code == 201, response.json()


def test_an_inactive_sector_is_a_400(admin_api, events):
    retired = SectorFactory(is_active=False)

    response = admin_api.post("/api/v1/automations", payload(retired), format="json")

    assert response.status_code == 400
    assert response.json()["error"]["details"] == {"sector": ["The sector is not active."]}
    assert events() == []


def test_a_body_that_is_not_json_is_a_400(admin_api):
    response = admin_api.post("/api/v1/automations", "{not json", content_type="application/json")

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "malformed_request"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("post", "/api/v1/automations", "create"),
        ("patch", "/api/v1/automations/{id}", {"max_concurrency": 5}),
        ("post", "/api/v1/automations/{id}/deactivate", None),
        ("post", "/api/v1/automations/{id}/worker/rotate-credential", None),
    ],
)
def test_people_who_are_not_platform_admins_cannot_write(
    person_api, automation, sector, events, method, path, body
):
    body = payload(sector) if body == "create" else body
    worker_before = Worker.objects.values().get()

    response = getattr(person_api, method)(path.format(id=automation.id), body, format="json")

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"
    assert Automation.objects.count() == 1
    assert Automation.objects.get().max_concurrency == automation.max_concurrency
    assert Worker.objects.values().get() == worker_before
    assert events() == []


def test_people_read_active_automations_without_their_worker(person_api, automation):
    retired = AutomationWithWorkerFactory(is_active=False)

    listed = person_api.get("/api/v1/automations").json()["results"]

    assert [a["id"] for a in listed] == [automation.id]
    assert listed[0]["worker"] is None
    assert person_api.get(f"/api/v1/automations/{retired.id}").status_code == 404
    assert person_api.get(f"/api/v1/automations/{automation.id}").json()["worker"] is None


def test_platform_admins_filter_by_sector_active_and_search(admin_api):
    finance, logistics = SectorFactory(), SectorFactory()
    a = AutomationWithWorkerFactory(name="Invoice export", sector=finance)
    b = AutomationWithWorkerFactory(name="Route planner", sector=logistics, description="trucks")
    c = AutomationWithWorkerFactory(name="Old invoices", sector=finance, is_active=False)

    def ids(query: str) -> list[int]:
        response = admin_api.get(f"/api/v1/automations{query}")
        assert response.status_code == 200
        return [item["id"] for item in response.json()["results"]]

    assert ids("") == [a.id, c.id, b.id]
    assert ids(f"?sector={finance.id}") == [a.id, c.id]
    assert ids("?active=true") == [a.id, b.id]
    assert ids(f"?active=false&sector={finance.id}") == [c.id]
    assert ids("?search=TRUCKS") == [b.id]
    assert ids("?search=invoice&active=true") == [a.id]
    listed = admin_api.get("/api/v1/automations").json()["results"]
    assert listed[0]["worker"]["provider"] == "local"


@pytest.mark.parametrize("caller", ["admin_api", "person_api"])
def test_the_list_takes_the_same_two_queries_however_many_automations_it_shows(
    request, caller, django_assert_max_num_queries
):
    AutomationWithWorkerFactory.create_batch(6)
    api = request.getfixturevalue(caller)

    # The page's count, then the page with each automation's worker joined in.
    with django_assert_max_num_queries(2):
        response = api.get("/api/v1/automations")

    assert len(response.json()["results"]) == 6


def test_a_bad_filter_is_a_400(admin_api):
    response = admin_api.get("/api/v1/automations?sector=finance")

    assert response.status_code == 400
    assert "sector" in response.json()["error"]["details"]


def test_updating_through_the_api_records_the_events_of_the_change(admin_api, automation, events):
    response = admin_api.patch(
        f"/api/v1/automations/{automation.id}",
        {"max_concurrency": 4, "worker": {"provider": "ec2", "machine_id": "i-0abcdef012345678"}},
        format="json",
    )

    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["max_concurrency"] == 4
    assert body["worker"]["provider"] == "ec2" and body["worker"]["status"] == "offline"
    assert events() == ["AutomationUpdated", "WorkerRegistered"]


def test_an_invalid_update_is_a_400_and_changes_nothing(admin_api, automation, events):
    response = admin_api.patch(
        f"/api/v1/automations/{automation.id}", {"max_concurrency": 0}, format="json"
    )

    assert response.status_code == 400
    assert "max_concurrency" in response.json()["error"]["details"]
    assert Automation.objects.get().max_concurrency == automation.max_concurrency
    assert events() == []


def test_deactivating_through_the_api_retires_the_worker_too(admin_api, automation, events):
    response = admin_api.post(f"/api/v1/automations/{automation.id}/deactivate")

    assert response.status_code == 200
    assert response.json()["is_active"] is False
    assert response.json()["worker"]["status"] == "deactivated"
    assert events() == ["AutomationDeactivated", "WorkerDeactivated"]
    again = admin_api.post(f"/api/v1/automations/{automation.id}/deactivate")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "automation_inactive"
    assert events() == ["AutomationDeactivated", "WorkerDeactivated"]


def test_rotating_returns_a_credential_that_works_and_retires_the_old_one(admin_api, automation):
    response = admin_api.post(f"/api/v1/automations/{automation.id}/worker/rotate-credential")

    assert response.status_code == 200
    credential = response.json()["credential"]
    assert authenticate(credential)[0].automation_id == automation.id
    with pytest.raises(AuthenticationFailed):
        authenticate(automation.credential)
    assert (
        "credential" not in admin_api.get(f"/api/v1/automations/{automation.id}").json()["worker"]
    )


def test_delete_is_refused_and_points_to_deactivate(admin_api, automation):
    response = admin_api.delete(f"/api/v1/automations/{automation.id}")

    assert response.status_code == 405
    assert response.json()["error"]["code"] == "method_not_allowed"
    assert f"/api/v1/automations/{automation.id}/deactivate" in response.json()["error"]["message"]
    assert Automation.objects.filter(pk=automation.pk, is_active=True).exists()


def test_the_schema_documents_every_catalog_endpoint(admin_api):
    response = admin_api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")

    paths = response.json()["paths"]
    for path, methods in {
        "/api/v1/sectors": {"get", "post"},
        "/api/v1/sectors/{sector_id}": {"get", "patch", "delete"},
        "/api/v1/sectors/{sector_id}/deactivate": {"post"},
        "/api/v1/automations": {"get", "post"},
        "/api/v1/automations/{automation_id}": {"get", "patch", "delete"},
        "/api/v1/automations/{automation_id}/deactivate": {"post"},
        "/api/v1/automations/{automation_id}/worker/rotate-credential": {"post"},
    }.items():
        assert methods <= set(paths[path]), path
    created = paths["/api/v1/automations"]["post"]["responses"]["201"]
    assert created["content"]["application/json"]["schema"]["$ref"].endswith("AutomationCreated")
