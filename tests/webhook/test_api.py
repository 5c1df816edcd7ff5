"""The webhooks API: managers of a tenant manage its endpoints; nobody else sees them."""

from __future__ import annotations

import threading
import uuid

import pytest
from django.db import connection, transaction
from rest_framework.test import APIClient

from common.errors import Conflict
from outbox.catalog import get_catalog
from outbox.models import Event
from outbox.runs import run_failed
from tests.factories import ManagerFactory, TenantFactory, UserFactory
from tests.webhook.conftest import Reply, run_due_attempts
from tests.webhook.test_delivery import complete_a_job
from webhook.events import TENANT_EVENT_TYPES
from webhook.models import WebhookDelivery, WebhookEndpoint
from webhook.services import endpoint_create, endpoint_enable

pytestmark = pytest.mark.django_db


@pytest.fixture
def api(manager):
    client = APIClient()
    client.force_authenticate(manager)
    return client


def create(api, url, event_types=("JobCompleted", "JobFailed"), **extra):
    return api.post(
        "/api/v1/webhooks", {"url": url, "event_types": list(event_types), **extra}, format="json"
    )


def test_a_manager_registers_an_endpoint_and_sees_its_secret_once(api, receiver):
    response = create(api, receiver.url, description="CRM")

    assert response.status_code == 201, response.content
    body = response.json()
    assert body["secret"].startswith("whsec_")
    assert body["event_types"] == ["JobCompleted", "JobFailed"]
    assert body["status"] == "active"
    assert body["description"] == "CRM"

    read = api.get(f"/api/v1/webhooks/{body['id']}").json()
    assert "secret" not in read
    listed = api.get("/api/v1/webhooks").json()
    assert [item["id"] for item in listed["results"]] == [body["id"]]
    assert "secret" not in listed["results"][0]


def test_event_types_are_checked_against_the_events_catalog(api, receiver):
    response = create(api, receiver.url, event_types=["JobCompleted", "JobExploded"])
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "webhook_unknown_event_type"
    assert "JobExploded" in error["message"]

    assert create(api, receiver.url, event_types=[]).status_code == 400


@pytest.mark.parametrize(
    "payload",
    [
        {},
        {"url": 3, "event_types": "JobCompleted"},
        {"url": "x" * 3000, "event_types": ["JobCompleted"]},
        {"url": "http://127.0.0.1/", "event_types": [None]},
        ["not", "an", "object"],
    ],
)
def test_bad_input_is_a_400_in_the_error_format(api, payload):
    response = api.post("/api/v1/webhooks", payload, format="json")
    assert response.status_code == 400
    assert set(response.json()["error"]) == {"code", "message", "details"}


def test_rotating_the_secret_shows_the_new_one_once(api, receiver):
    created = create(api, receiver.url).json()
    response = api.post(f"/api/v1/webhooks/{created['id']}/rotate-secret")
    assert response.status_code == 200
    assert response.json()["secret"].startswith("whsec_")
    assert response.json()["secret"] != created["secret"]


def test_disabling_stops_deliveries_and_says_why(api, receiver, tenant):
    created = create(api, receiver.url).json()
    response = api.post(
        f"/api/v1/webhooks/{created['id']}/disable", {"reason": "migrating"}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["status"] == "disabled"
    assert response.json()["disabled_reason"] == "migrating"
    assert api.post(f"/api/v1/webhooks/{created['id']}/disable").status_code == 409
    assert api.post(f"/api/v1/webhooks/{created['id']}/rotate-secret").status_code == 409

    complete_a_job(tenant)
    assert run_due_attempts() == 0

    enabled = api.post(f"/api/v1/webhooks/{created['id']}/enable")
    assert enabled.status_code == 200 and enabled.json()["status"] == "active"


def test_endpoints_are_never_deleted(api, receiver):
    created = create(api, receiver.url).json()
    response = api.delete(f"/api/v1/webhooks/{created['id']}")
    assert response.status_code == 405
    assert "disable" in response.json()["error"]["message"]


def test_updating_the_url_and_event_types(api, receiver):
    created = create(api, receiver.url).json()
    response = api.patch(
        f"/api/v1/webhooks/{created['id']}",
        {"event_types": ["JobCanceled"], "url": receiver.url + "/v2"},
        format="json",
    )
    assert response.status_code == 200
    assert response.json()["event_types"] == ["JobCanceled"]
    assert response.json()["url"].endswith("/v2")


def test_recent_deliveries_show_status_codes_and_latency(api, receiver, tenant):
    created = create(api, receiver.url).json()
    receiver.script(Reply(status=503))
    complete_a_job(tenant)
    run_due_attempts()
    run_due_attempts()
    complete_a_job(tenant)
    run_due_attempts()

    response = api.get(f"/api/v1/webhooks/{created['id']}/deliveries")

    assert response.status_code == 200
    assert response.json()["count"] == 2
    newest, oldest = response.json()["results"]
    assert newest["status"] == "delivered" and newest["attempts"] == 1
    assert oldest["status"] == "delivered"
    assert oldest["event_type"] == "JobCompleted"
    assert oldest["status_code"] == 200
    assert isinstance(oldest["latency_ms"], int)
    assert oldest["message_id"].startswith("msg_")
    assert [(a["number"], a["status_code"]) for a in oldest["history"]] == [(1, 503), (2, 200)]
    assert all(isinstance(a["latency_ms"], int) for a in oldest["history"])


def test_the_deliveries_count_is_the_endpoints_whole_list_on_every_page(api, receiver, tenant):
    created = create(api, receiver.url).json()
    for _ in range(3):
        complete_a_job(tenant)
    run_due_attempts()
    url = f"/api/v1/webhooks/{created['id']}/deliveries"

    first = api.get(url, {"limit": 2}).json()
    second = api.get(first["next"]).json()

    assert (first["count"], len(first["results"])) == (3, 2)
    assert (second["count"], len(second["results"])) == (3, 1)


def test_a_disabled_endpoints_reason_is_visible_to_its_managers(api, receiver, tenant):
    created = create(api, receiver.url).json()
    WebhookEndpoint.objects.filter(pk=created["id"]).update(
        status="disabled", disabled_reason="Every delivery failed for 5 days"
    )
    body = api.get(f"/api/v1/webhooks/{created['id']}").json()
    assert body["status"] == "disabled"
    assert body["disabled_reason"] == "Every delivery failed for 5 days"


def test_another_tenants_endpoint_is_a_404(api, receiver):
    other_manager = ManagerFactory(tenant=TenantFactory())
    other = APIClient()
    other.force_authenticate(other_manager)
    theirs = create(other, receiver.url).json()

    for method, path in [
        ("get", f"/api/v1/webhooks/{theirs['id']}"),
        ("patch", f"/api/v1/webhooks/{theirs['id']}"),
        ("post", f"/api/v1/webhooks/{theirs['id']}/rotate-secret"),
        ("post", f"/api/v1/webhooks/{theirs['id']}/disable"),
        ("get", f"/api/v1/webhooks/{theirs['id']}/deliveries"),
    ]:
        body = {"description": "theirs now"} if method == "patch" else {}
        response = getattr(api, method)(path, body, format="json")
        assert response.status_code == 404, (method, path)
        assert response.json()["error"]["code"] == "webhook_not_found"
    assert api.get("/api/v1/webhooks").json()["results"] == []


def test_members_cannot_manage_webhooks(tenant, receiver):
    member = APIClient()
    member.force_authenticate(UserFactory(tenant=tenant))
    assert member.get("/api/v1/webhooks").status_code == 403
    assert create(member, receiver.url).status_code == 403


def test_anonymous_callers_are_refused():
    assert APIClient().get("/api/v1/webhooks").status_code == 401


# --- what a tenant may subscribe to -----------------------------------------------------------


@pytest.mark.parametrize("internal", ["TaskFailed", "WorkerRegistered", "AutomationCreated"])
def test_the_hubs_own_events_cannot_be_subscribed(api, receiver, internal):
    response = create(api, receiver.url, event_types=["JobCompleted", internal])

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "webhook_event_type_not_allowed"
    assert internal in error["message"]
    # The answer says what may be subscribed instead.
    for allowed in TENANT_EVENT_TYPES:
        assert allowed in error["message"]
    assert error["details"]["event_types"]
    assert not WebhookEndpoint.objects.exists()


def test_an_update_cannot_subscribe_the_hubs_own_events_either(api, receiver):
    created = create(api, receiver.url).json()
    response = api.patch(
        f"/api/v1/webhooks/{created['id']}", {"event_types": ["TaskFailed"]}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["error"]["code"] == "webhook_event_type_not_allowed"
    assert WebhookEndpoint.objects.get(pk=created["id"]).event_types == [
        "JobCompleted",
        "JobFailed",
    ]


def test_the_tenant_facing_events_are_events_of_the_catalog():
    assert set(TENANT_EVENT_TYPES) <= get_catalog().events
    assert "TaskFailed" not in TENANT_EVENT_TYPES


@pytest.mark.parametrize("event_type", sorted(TENANT_EVENT_TYPES))
def test_every_tenant_facing_event_can_be_subscribed(api, receiver, event_type):
    assert create(api, receiver.url, event_types=[event_type]).status_code == 201


def test_a_failed_task_of_the_tenant_never_becomes_a_delivery(api, receiver, tenant):
    created = create(api, receiver.url).json()
    # An endpoint written before the rule (or by hand) that names the hub's own event.
    WebhookEndpoint.objects.filter(pk=created["id"]).update(
        event_types=["JobCompleted", "TaskFailed"]
    )

    with transaction.atomic():
        run_failed(
            str(uuid.uuid4()),
            task="machines.power_on",
            queue="critical",
            tenant=tenant,
            error_type="EndpointConnectionError",
            message='Could not connect to "https://ec2.sa-east-1.amazonaws.com/"',
            receive_count=5,
            actor="worker",
        )

    assert Event.objects.filter(type="TaskFailed", tenant_id=tenant.pk).exists()
    assert not WebhookDelivery.objects.exists()
    assert run_due_attempts() == 0
    assert receiver.requests() == []


# --- the tenant's limit -----------------------------------------------------------------------


def test_a_tenant_at_its_limit_of_endpoints_is_refused_until_it_disables_one(
    api, receiver, settings
):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT = 3
    first, *_ = [create(api, receiver.url).json() for _ in range(3)]

    refused = create(api, receiver.url)
    api.post(f"/api/v1/webhooks/{first['id']}/disable")
    accepted = create(api, receiver.url)
    # Enabling the disabled one again would be a fourth active endpoint.
    enabled = api.post(f"/api/v1/webhooks/{first['id']}/enable")

    assert refused.status_code == 409
    error = refused.json()["error"]
    assert error["code"] == "endpoint_limit_reached"
    assert "3" in error["message"]
    assert error["details"] == {"limit": 3}
    assert accepted.status_code == 201
    assert enabled.status_code == 409
    assert enabled.json()["error"]["code"] == "endpoint_limit_reached"
    assert WebhookEndpoint.objects.filter(status="active").count() == 3


def test_another_tenants_endpoints_do_not_count(api, receiver, settings):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT = 1
    other = APIClient()
    other.force_authenticate(ManagerFactory(tenant=TenantFactory()))
    assert create(other, receiver.url).status_code == 201

    assert create(api, receiver.url).status_code == 201


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("operation", ["create", "enable"])
def test_creations_racing_for_the_last_place_never_pass_the_limit(
    tenant, manager, settings, operation
):
    settings.WEBHOOK_MAX_ENDPOINTS_PER_TENANT = 4
    url = "http://127.0.0.1:9/hooks"
    for _ in range(3):
        endpoint_create(tenant=tenant, url=url, event_types=["JobCompleted"], actor=manager)
    threads = 8
    disabled = []
    if operation == "enable":
        for _ in range(threads):
            endpoint = endpoint_create(
                tenant=tenant, url=url, event_types=["JobCompleted"], actor=manager
            )
            WebhookEndpoint.objects.filter(pk=endpoint.pk).update(status="disabled")
            disabled.append(endpoint.pk)
    start = threading.Barrier(threads)
    outcomes: list[str] = []

    def take_the_last_place(position: int) -> None:
        try:
            start.wait(10)
            if operation == "create":
                endpoint_create(tenant=tenant, url=url, event_types=["JobCompleted"], actor=manager)
            else:
                endpoint_enable(tenant=tenant, endpoint_id=disabled[position], actor=manager)
            outcomes.append("created")
        except Conflict as refusal:
            outcomes.append(refusal.code)
        finally:
            connection.close()

    workers = [threading.Thread(target=take_the_last_place, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=60)

    assert sorted(outcomes) == ["created"] + ["endpoint_limit_reached"] * 7
    assert WebhookEndpoint.objects.filter(tenant=tenant, status="active").count() == 4


@pytest.mark.django_db(transaction=True)
def test_the_migration_takes_the_hubs_own_events_off_endpoints_and_pending_deliveries(
    api, receiver, tenant
):
    from django.db.migrations.executor import MigrationExecutor

    mixed = create(api, receiver.url).json()
    internal_only = create(api, receiver.url).json()
    WebhookEndpoint.objects.filter(pk=mixed["id"]).update(
        event_types=["JobCompleted", "TaskFailed"]
    )
    WebhookEndpoint.objects.filter(pk=internal_only["id"]).update(event_types=["TaskFailed"])
    # A delivery of TaskFailed recorded before the rule, still pending, and one of a job.
    complete_a_job(tenant)
    leaked = WebhookDelivery.objects.filter(endpoint_id=mixed["id"]).get()
    WebhookDelivery.objects.filter(pk=leaked.pk).update(event_type="TaskFailed")
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("webhook")
    executor.migrate([("webhook", "0003_webhook_secrets_sealed")])
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(latest)

    assert WebhookEndpoint.objects.get(pk=mixed["id"]).event_types == ["JobCompleted"]
    disabled = WebhookEndpoint.objects.get(pk=internal_only["id"])
    assert disabled.event_types == [] and disabled.status == "disabled"
    assert "hub's own events" in disabled.disabled_reason
    leaked.refresh_from_db()
    assert leaked.status == "failed" and leaked.scheduled_run_id is None
    run_due_attempts()
    assert receiver.requests() == []
