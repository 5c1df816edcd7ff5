"""Text PostgreSQL or UTF-8 cannot hold is a 400 wherever it comes in, on every operation.

U+0000 (refused by PostgreSQL's text and jsonb) and a lone surrogate (JSON can spell
``"\\ud800"``; UTF-8 cannot encode it) are refused once, where requests are parsed. The
operations are read from the OpenAPI schema, so a new endpoint is covered without
being listed here.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from identity.models import User
from job.models import Job, JobOutputChunk
from schedule.services import schedule_create
from tests.factories import (
    AutomationWithWorkerFactory,
    ManagerFactory,
    PlatformAdminFactory,
    RunningJobFactory,
    TenantFactory,
    UserFactory,
)
from tests.identity.support import client_for
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db

SURROGATE = "\ud800"
NUL = "\u0000"


def _schema() -> dict:
    return SchemaGenerator().get_schema(request=None, public=True)


def _resolve(schema: dict, node: dict) -> dict:
    while "$ref" in node:
        node = schema["components"]["schemas"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _operations() -> list[tuple[str, str, list[str], list[str]]]:
    """(method, path, body properties, query parameters) of every operation."""
    schema = _schema()
    found = []
    for path, item in schema["paths"].items():
        for method, operation in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            body = operation.get("requestBody", {}).get("content", {}).get("application/json")
            properties = (
                sorted(_resolve(schema, body["schema"]).get("properties", {})) if body else []
            )
            query = [p["name"] for p in operation.get("parameters", []) if p["in"] == "query"]
            found.append((method, path, properties, query))
    return found


OPERATIONS = _operations()


@pytest.fixture
def world(db):
    tenant = TenantFactory()
    manager = ManagerFactory(tenant=tenant)
    member = UserFactory(tenant=tenant)
    automation = AutomationWithWorkerFactory()
    running = RunningJobFactory(tenant=tenant, automation=automation, requested_by=manager)
    schedule = schedule_create(
        tenant=tenant, actor=manager, automation_id=automation.pk, name="nightly", cron="0 6 * * *"
    )
    endpoint = endpoint_create(
        tenant=tenant,
        url="https://hooks.example.com/hub",
        event_types=["JobCompleted"],
        actor=manager,
    )
    worker = APIClient(raise_request_exception=False)
    worker.credentials(HTTP_AUTHORIZATION=f"Bearer {automation.credential}")
    clients = {
        "admin": client_for(PlatformAdminFactory()),
        "manager": client_for(manager),
        "worker": worker,
        "anonymous": APIClient(raise_request_exception=False),
    }
    ids = {
        "tenant_id": tenant.pk,
        "user_id": member.pk,
        "automation_id": automation.pk,
        "job_id": running.pk,
        "sector_id": automation.sector_id,
        "schedule_id": schedule.pk,
        "endpoint_id": endpoint.pk,
    }
    return clients, ids


def _url(path: str, ids: dict) -> str:
    return re.sub(r"\{(\w+)\}", lambda m: str(ids[m.group(1)]), path)


def _send(client, method, url, body=None, **extra):
    # Encoded with escapes, as a client's JSON library sends a lone surrogate.
    data = json.dumps(body) if body is not None else ""
    return client.generic(method.upper(), url, data, content_type="application/json", **extra)


def _answers(world, method, path, body=None, query=None, **extra):
    clients, ids = world
    url = _url(path, ids)
    if query:
        url += "?" + "&".join(f"{name}=a%00b" for name in query)
    return {role: _send(client, method, url, body, **extra) for role, client in clients.items()}


def _assert_refused(answers: dict) -> None:
    for role, response in answers.items():
        assert response.status_code < 500, (role, response.status_code, response.content)
    refused = [
        r
        for r in answers.values()
        if r.status_code == 400 and r.json()["error"]["code"] == "invalid"
    ]
    assert refused, {role: r.status_code for role, r in answers.items()}
    for response in refused:
        assert set(response.json()["error"]) == {"code", "message", "details"}


# A body each operation accepts, from the role allowed to send it: one bad value in it
# then reaches as far as the request can go (the database, the renderer) when unchecked.
def _valid_bodies(ids: dict) -> dict[tuple[str, str], tuple[str, dict]]:
    token = str(Job.objects.get(pk=ids["job_id"]).claim_token)
    automation = {
        "name": "Invoice export",
        "slug": "invoice-export",
        "description": "Exports",
        "sector": ids["sector_id"],
        "command": ["python", "export.py"],
        "max_concurrency": 2,
        "max_attempts": 1,
        "timeout_seconds": 60,
        "params_schema": {"type": "object", "properties": {"month": {"type": "string"}}},
        "worker": {"provider": "local", "machine_id": "m-1", "region": ""},
    }
    sector = {"name": "Finance", "slug": "finance", "description": "Money"}
    schedule = {
        "name": "Nightly",
        "automation": ids["automation_id"],
        "cron": "0 6 * * *",
        "timezone": "UTC",
        "params": {},
        "misfire": "run_once",
    }
    webhook = {
        "url": "https://hooks.example.com/orders",
        "event_types": ["JobCompleted", "JobFailed"],
        "description": "Orders",
    }
    refresh = {"refresh_token": "hdr_unknown"}
    return {
        ("post", "/api/v1/auth/login"): ("anonymous", {"email": "x@x.example", "password": "p"}),
        ("post", "/api/v1/auth/logout"): ("anonymous", refresh),
        ("post", "/api/v1/auth/refresh"): ("anonymous", refresh),
        ("post", "/api/v1/automations"): ("admin", automation),
        ("patch", "/api/v1/automations/{automation_id}"): ("admin", automation),
        ("post", "/api/v1/jobs"): ("manager", {"automation": ids["automation_id"], "params": {}}),
        ("post", "/api/v1/jobs/{job_id}/complete"): (
            "worker",
            {"claim_token": token, "result": {}, "output_tail": "out", "exit_code": 0},
        ),
        ("post", "/api/v1/jobs/{job_id}/fail"): (
            "worker",
            {
                "claim_token": token,
                "error": "e",
                "output_tail": "o",
                "exit_code": 1,
                "reason": None,
            },
        ),
        # Another worker's claim (the job is running): refused as already claimed.
        ("post", "/api/v1/jobs/{job_id}/start"): ("worker", {"claim_token": str(uuid.uuid4())}),
        ("post", "/api/v1/jobs/{job_id}/heartbeat"): (
            "worker",
            {"claim_token": token, "progress": {"step": 1}},
        ),
        ("post", "/api/v1/jobs/{job_id}/output"): (
            "worker",
            {"claim_token": token, "seq": 0, "text": "tick\n"},
        ),
        ("post", "/api/v1/schedules"): ("manager", schedule),
        ("patch", "/api/v1/schedules/{schedule_id}"): ("manager", schedule),
        ("post", "/api/v1/webhooks"): ("manager", webhook),
        ("patch", "/api/v1/webhooks/{endpoint_id}"): ("manager", webhook),
        ("post", "/api/v1/webhooks/{endpoint_id}/disable"): ("manager", {"reason": "Moving"}),
        ("post", "/api/v1/sectors"): ("admin", sector),
        ("patch", "/api/v1/sectors/{sector_id}"): ("admin", sector),
        ("post", "/api/v1/tenants"): ("admin", {"name": "New", "slug": "new"}),
        ("patch", "/api/v1/tenants/{tenant_id}"): ("admin", {"name": "Renamed"}),
        ("post", "/api/v1/users"): (
            "admin",
            {
                "email": "new@x.example",
                "full_name": "New",
                "password": "a-long-and-unusual-passphrase-91",
                "role": "member",
                "tenant": ids["tenant_id"],
            },
        ),
        ("patch", "/api/v1/users/{user_id}"): ("manager", {"full_name": "N", "role": "manager"}),
    }


# A command's output may hold anything: those fields are cleaned, not refused.
REPLACED = {
    ("post", "/api/v1/jobs/{job_id}/complete"): {"output_tail"},
    ("post", "/api/v1/jobs/{job_id}/fail"): {"output_tail", "error"},
    ("post", "/api/v1/jobs/{job_id}/output"): {"text"},
}

BAD_VALUES = {
    "lone surrogate": SURROGATE,
    "nul": f"a{NUL}b",
    "lone surrogate in a list": ["python", SURROGATE],
    "lone surrogate in a nested key": {"deep": [{SURROGATE: 1}]},
    "nul in a nested value": [[{"x": NUL}]],
}
BODY_CASES = [
    (method, path, prop, variant)
    for method, path, props, _ in OPERATIONS
    for prop in props
    for variant in BAD_VALUES
]


def test_every_operation_with_a_body_has_a_valid_body_here(world):
    _, ids = world
    bodies = _valid_bodies(ids)
    for method, path, props, _ in OPERATIONS:
        if props:
            assert (method, path) in bodies, f"add a valid body for {method} {path}"
            assert set(props) <= set(bodies[method, path][1]) | {"claim_token"}, (method, path)


def test_the_valid_bodies_are_not_refused_as_invalid(world):
    # Otherwise a bad value in them would be refused for another reason than its text.
    clients, ids = world
    for (method, path), (role, body) in _valid_bodies(ids).items():
        response = _send(clients[role], method, _url(path, ids), body)
        assert response.status_code != 400, (method, path, response.content)


@pytest.mark.parametrize(
    ("method", "path", "prop", "variant"),
    BODY_CASES,
    ids=[f"{m} {p} {prop} {v}" for m, p, prop, v in BODY_CASES],
)
def test_unstorable_text_in_any_field_of_any_body_is_a_400(world, method, path, prop, variant):
    clients, ids = world
    role, body = _valid_bodies(ids)[method, path]
    body = {**body, prop: BAD_VALUES[variant]}

    response = _send(clients[role], method, _url(path, ids), body)

    assert response.status_code < 500, response.content
    if prop in REPLACED.get((method, path), ()) and isinstance(BAD_VALUES[variant], str):
        assert response.status_code == 200, response.content
        if path.endswith("/output"):  # a piece of the running job's log
            stored = JobOutputChunk.objects.get(job_id=ids["job_id"]).text
        else:
            stored = getattr(Job.objects.get(pk=ids["job_id"]), prop)
        assert "\ufffd" in stored
    else:
        assert response.status_code == 400, response.content
        error = response.json()["error"]
        assert error["code"] == "invalid"
        assert list(error["details"]) == [prop]


@pytest.mark.parametrize(
    ("method", "path"),
    [(m, p) for m, p, props, _ in OPERATIONS if not props],
    ids=[f"{m} {p}" for m, p, props, _ in OPERATIONS if not props],
)
def test_no_operation_answers_a_500_to_an_unstorable_body(world, method, path):
    answers = _answers(world, method, path, {SURROGATE: [NUL]})

    for role, response in answers.items():
        assert response.status_code < 500, (role, response.content)


@pytest.mark.parametrize(
    ("method", "path", "query"),
    [(m, p, q) for m, p, _, q in OPERATIONS if q],
    ids=[f"{m} {p}" for m, p, _, q in OPERATIONS if q],
)
def test_every_query_parameter_holding_nul_is_a_400(world, method, path, query):
    _assert_refused(_answers(world, method, path, query=query))


def test_the_operations_were_found():
    # Guards the parametrization above: an empty schema would make every test pass.
    bodies = {(m, p) for m, p, props, _ in OPERATIONS if props}
    assert ("post", "/api/v1/jobs") in bodies
    assert ("post", "/api/v1/jobs/{job_id}/heartbeat") in bodies
    assert ("patch", "/api/v1/users/{user_id}") in bodies
    assert ("patch", "/api/v1/automations/{automation_id}") in bodies
    assert len(bodies) >= 12


def test_an_idempotency_key_holding_nul_is_a_400(world):
    clients, ids = world
    response = _send(
        clients["manager"],
        "post",
        "/api/v1/jobs",
        {"automation": ids["automation_id"], "params": {}},
        HTTP_IDEMPOTENCY_KEY="a\u0000b",
    )

    assert response.status_code == 400, response.content
    assert not Job.objects.filter(idempotency_key__isnull=False).exists()


def test_a_session_cookie_holding_nul_is_a_400_not_a_500(world):
    clients, _ = world

    response = clients["anonymous"].get("/admin/", HTTP_COOKIE="sessionid=a\u0000b")

    assert response.status_code == 400


def test_an_admin_search_holding_nul_is_a_400(client, db):
    admin = PlatformAdminFactory()
    client.force_login(admin)

    response = client.get("/admin/identity/user/", {"q": "a\u0000b"})

    assert response.status_code == 400


def test_a_form_body_holding_nul_is_a_400(client, db):
    admin = PlatformAdminFactory()
    client.force_login(admin)

    response = client.post("/admin/identity/tenant/add/", {"name": "a\u0000b", "slug": "x"})

    assert response.status_code == 400
    assert not User.objects.filter(tenant__slug="x").exists()


@pytest.mark.parametrize("text", [SURROGATE, "a\u0000b"], ids=["surrogate", "nul"])
def test_the_error_names_where_the_text_is_without_repeating_it(world, text):
    clients, ids = world
    response = _send(
        clients["manager"],
        "post",
        "/api/v1/jobs",
        {"automation": ids["automation_id"], "params": {"a": [1, {"b": text}]}},
    )

    assert response.status_code == 400, response.content
    details = response.json()["error"]["details"]
    assert list(details) == ["params"]
    assert "params/a/1/b" in details["params"][0]


@pytest.mark.parametrize(
    "content_type",
    ["multipart/form-data", "multipart/form-data; boundary=", "multipart/form-data; boundary=x"],
)
def test_a_malformed_form_body_is_a_4xx_not_a_500(world, content_type):
    clients, _ = world

    response = clients["manager"].generic(
        "POST", "/api/v1/jobs", b"--x\r\nnot a part\r\n", content_type=content_type
    )

    assert 400 <= response.status_code < 500, response.content
    assert set(response.json()["error"]) == {"code", "message", "details"}


def test_too_many_form_fields_are_a_4xx_not_a_500(world, settings):
    clients, _ = world
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 10

    response = clients["manager"].generic(
        "POST",
        "/api/v1/jobs",
        "&".join(f"f{n}=1" for n in range(20)),
        content_type="application/x-www-form-urlencoded",
    )

    assert 400 <= response.status_code < 500, response.content
    assert set(response.json()["error"]) == {"code", "message", "details"}
