"""The audit trail: GET /api/v1/events."""

from __future__ import annotations

import base64
from datetime import timedelta
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone
from rest_framework.test import APIRequestFactory, force_authenticate

from outbox.api import EventsApi
from outbox.models import Event
from outbox.selectors import ID_ORDER_SKEW
from tests.clients import client_of
from tests.factories import AutomationFactory, ManagerFactory, UserFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/events"


def record(tenant, type="JobCreated", *, aggregate=("Job", "1"), actor="system", **fields):
    return Event.objects.create(
        type=type,
        aggregate_type=aggregate[0],
        aggregate_id=aggregate[1],
        tenant=tenant,
        actor=actor,
        payload=fields.pop("payload", {}),
        **fields,
    )


@pytest.fixture
def manager(tenant):
    return ManagerFactory(tenant=tenant)


@pytest.fixture
def api(manager):
    return client_of(manager)


@pytest.fixture
def admin_api(platform_admin):
    return client_of(platform_admin)


def ids(response) -> list[int]:
    assert response.status_code == 200, response.json()
    return [event["id"] for event in response.json()["results"]]


def cursor_of(link: str) -> str:
    return parse_qs(urlsplit(link).query)["cursor"][0]


def made_up_cursor(position: str) -> str:
    return base64.b64encode(f"o=0&p={position}".encode()).decode()


def test_the_tenants_events_are_listed_newest_first_with_their_whole_record(api, tenant, manager):
    first = record(tenant, "JobCreated", aggregate=("Job", "7"), actor=f"user:{manager.id}")
    second = record(
        tenant,
        "JobStarted",
        aggregate=("Job", "7"),
        actor="worker:3",
        payload={"job_id": 7},
        correlation_id="req-1",
    )

    response = api.get(URL)

    assert ids(response) == [second.id, first.id]
    assert response.json()["results"][0] == {
        "id": second.id,
        "type": "JobStarted",
        "aggregate": {"type": "Job", "id": "7"},
        "actor": "worker:3",
        "correlation_id": "req-1",
        "occurred_at": second.occurred_at.isoformat().replace("+00:00", "Z"),
        "payload": {"job_id": 7},
        "tenant": tenant.id,
    }


def test_the_cursor_pages_cover_every_event_once_newest_first(api, tenant):
    events = [record(tenant, aggregate=("Job", str(n))) for n in range(11)]

    seen, url, pages = [], f"{URL}?limit=4", 0
    while url:
        body = api.get(url).json()
        seen += [event["id"] for event in body["results"]]
        url, pages = body["next"], pages + 1

    assert seen == [event.id for event in reversed(events)]
    assert pages == 3


def test_a_type_filter_takes_one_type_or_several(api, tenant):
    created = record(tenant, "JobCreated")
    started = record(tenant, "JobStarted")
    failed = record(tenant, "JobFailed")

    assert ids(api.get(URL, {"type": "JobStarted"})) == [started.id]
    assert ids(api.get(URL, {"type": "JobFailed, JobCreated"})) == [failed.id, created.id]
    assert ids(api.get(URL, {"type": "NothingLikeThis"})) == []


def test_an_aggregate_filter_takes_its_type_alone_or_with_its_id(api, tenant):
    job_7 = record(tenant, aggregate=("Job", "7"))
    job_8 = record(tenant, aggregate=("Job", "8"))
    schedule_7 = record(tenant, "ScheduleCreated", aggregate=("Schedule", "7"))

    assert ids(api.get(URL, {"aggregate_type": "Job"})) == [job_8.id, job_7.id]
    assert ids(api.get(URL, {"aggregate_type": "Job", "aggregate_id": "7"})) == [job_7.id]
    assert ids(api.get(URL, {"aggregate_type": "Schedule", "aggregate_id": "7"})) == [schedule_7.id]


def test_an_actor_filter_is_exact(api, tenant):
    by_12 = record(tenant, actor="user:12")
    record(tenant, actor="user:123")
    record(tenant, actor="system")

    assert ids(api.get(URL, {"actor": "user:12"})) == [by_12.id]


def test_a_time_range_keeps_events_at_or_after_its_start_and_before_its_end(api, tenant):
    now = timezone.now()
    old, middle, recent = (
        record(tenant, occurred_at=now - timedelta(days=days)) for days in (10, 5, 1)
    )
    start, end = (now - timedelta(days=5)).isoformat(), (now - timedelta(days=1)).isoformat()

    assert ids(api.get(URL, {"occurred_after": start})) == [recent.id, middle.id]
    assert ids(api.get(URL, {"occurred_before": end})) == [middle.id, old.id]
    assert ids(api.get(URL, {"occurred_after": start, "occurred_before": end})) == [middle.id]


def test_an_event_written_out_of_id_order_within_the_skew_is_still_in_its_range(api, tenant):
    """Ids follow occurred_at only up to ``ID_ORDER_SKEW``: the time range, which reads an
    id range, must still find an event whose id is below an earlier event's."""
    moment = timezone.now() - timedelta(hours=1)
    record(tenant, occurred_at=moment - timedelta(hours=1))
    late = record(tenant, occurred_at=moment + ID_ORDER_SKEW / 3)  # the smaller id
    early = record(tenant, occurred_at=moment - ID_ORDER_SKEW / 3)  # the greater id
    record(tenant, occurred_at=moment + timedelta(hours=1))

    after = api.get(URL, {"occurred_after": moment.isoformat()})
    before = api.get(URL, {"occurred_before": moment.isoformat()})

    assert late.id in ids(after) and early.id not in ids(after)
    assert early.id in ids(before) and late.id not in ids(before)


@pytest.mark.parametrize(
    "bound, moment",
    [
        ("occurred_after", "0001-01-01T00:00:00Z"),
        ("occurred_after", "0001-01-01T00:04:59Z"),
        ("occurred_before", "0001-01-01T00:00:00Z"),
        ("occurred_after", "9999-12-31T23:55:00Z"),
        ("occurred_before", "9999-12-31T23:59:59Z"),
    ],
)
def test_a_time_range_at_the_ends_of_the_calendar_is_answered(api, tenant, bound, moment):
    # Each bound is widened by the skew to an id range: at the calendar's first or last
    # minutes that arithmetic has no time to land on, and the widest range is meant.
    event = record(tenant)

    response = api.get(URL, {bound: moment})

    assert response.status_code == 200, response.content
    everything = (bound == "occurred_after") == moment.startswith("0001")
    assert ids(response) == ([event.id] if everything else [])


@pytest.mark.parametrize(
    "query, field",
    [
        ({"occurred_after": "yesterday"}, "occurred_after"),
        ({"occurred_after": "2026-12-01T09:00:00"}, "occurred_after"),  # no offset
        ({"occurred_before": "2026-13-01T09:00:00Z"}, "occurred_before"),
        ({"aggregate_id": "7"}, "aggregate_id"),
        (
            {
                "occurred_after": "2026-12-01T09:00:00Z",
                "occurred_before": "2026-12-01T10:00:00+01:00",
            },
            "occurred_before",
        ),
        (
            {"occurred_after": "2026-12-01T09:00:00Z", "occurred_before": "2026-12-01T08:00:00Z"},
            "occurred_before",
        ),
        ({"limit": "0"}, "limit"),
        ({"limit": "many"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"type": " , "}, "type"),
        ({"type": ",".join(f"Type{n}" for n in range(21))}, "type"),
        ({"actor": "x" * 201}, "actor"),
        ({"actor": "user:\x001"}, "actor"),
        ({"tenant": "first"}, "tenant"),
    ],
)
def test_a_bad_filter_is_refused_in_the_error_format(api, query, field):
    response = api.get(URL, query)

    assert response.status_code == 400, response.json()
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert field in error["details"]


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        made_up_cursor("abc"),
        made_up_cursor("-5"),
        made_up_cursor(str(2**63)),
        made_up_cursor("2026-12-01T09:00:00Z"),
    ],
)
def test_a_bad_cursor_is_refused_as_invalid_cursor(manager, tenant, cursor):
    record(tenant)

    response = client_of(manager, raise_request_exception=False).get(URL, {"cursor": cursor})

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_another_tenants_events_are_never_listed(api, tenant, other_tenant):
    mine = record(tenant, aggregate=("Job", "1"), actor="system")
    record(other_tenant, aggregate=("Job", "2"), actor="system")
    record(other_tenant, "TenantRenamed", aggregate=("Tenant", str(other_tenant.id)))
    record(None, "AutomationCreated", aggregate=("Automation", "1"))  # the platform's

    assert ids(api.get(URL)) == [mine.id]
    assert ids(api.get(URL, {"aggregate_type": "Job", "aggregate_id": "2"})) == []
    assert ids(api.get(URL, {"type": "TenantRenamed"})) == []
    assert ids(api.get(URL, {"type": "AutomationCreated"})) == []
    assert ids(api.get(URL, {"actor": "system"})) == [mine.id]
    assert ids(api.get(URL, {"tenant": other_tenant.id})) == []
    assert ids(api.get(URL, {"tenant": tenant.id})) == [mine.id]


def test_a_platform_admin_reads_every_tenants_events_and_the_platforms(
    admin_api, tenant, other_tenant
):
    mine = record(tenant)
    theirs = record(other_tenant)
    platform = record(None, "AutomationCreated", aggregate=("Automation", "1"))

    assert ids(admin_api.get(URL)) == [platform.id, theirs.id, mine.id]
    assert ids(admin_api.get(URL, {"tenant": other_tenant.id})) == [theirs.id]
    assert ids(admin_api.get(URL, {"type": "AutomationCreated"})) == [platform.id]
    assert admin_api.get(URL).json()["results"][0]["tenant"] is None


def test_without_credentials_the_answer_is_401(tenant):
    record(tenant)

    response = client_of(None).get(URL)

    assert response.status_code == 401
    assert response.json()["error"]["code"] == "not_authenticated"


def test_a_member_who_is_not_a_manager_is_refused(user):
    response = client_of(user).get(URL)

    assert response.status_code == 403
    assert response.json()["error"]["code"] == "forbidden"


def test_a_manager_of_a_deactivated_tenant_is_refused(manager, tenant):
    tenant.is_active = False
    tenant.save(update_fields=["is_active"])

    assert client_of(manager).get(URL).status_code == 403


def test_the_view_served_without_its_readers_refuses_even_a_platform_admin(platform_admin):
    # Who may read the trail is given where its URL is served; a view served without it
    # lets nobody in, not every authenticated caller.
    request = APIRequestFactory().get(URL)
    force_authenticate(request, user=platform_admin)

    response = EventsApi.as_view()(request)

    assert response.status_code == 403


def test_a_job_created_through_the_api_appears_with_its_actor_and_correlation_id(api, tenant):
    member = UserFactory(tenant=tenant)
    automation = AutomationFactory()
    created = client_of(member, token=True).post(
        "/api/v1/jobs",
        {"automation": automation.id},
        format="json",
        HTTP_X_REQUEST_ID="trail-check-1",
    )
    assert created.status_code == 201, created.json()
    job_id = created.json()["id"]

    response = api.get(URL, {"aggregate_type": "Job", "aggregate_id": str(job_id)})

    (event,) = response.json()["results"]
    assert event["type"] == "JobCreated"
    assert event["actor"] == f"user:{member.id}"
    assert event["correlation_id"] == "trail-check-1"
    assert event["tenant"] == tenant.id
    assert event["payload"]["job_id"] == job_id
    assert ids(api.get(URL, {"actor": f"user:{member.id}", "type": "JobCreated"})) == [event["id"]]
