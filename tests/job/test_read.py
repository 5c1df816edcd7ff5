"""Reading jobs: GET /api/v1/jobs and /api/v1/jobs/{id}, tenant-scoped."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from django.utils import timezone
from drf_spectacular.generators import SchemaGenerator

from tests.factories import AutomationFactory, JobFactory, RunningJobFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/jobs"


def ids(response) -> list[int]:
    return [item["id"] for item in response.json()["results"]]


def test_the_list_shows_the_tenants_jobs_newest_first(person_client, user, other_tenant):
    now = timezone.now()
    old = JobFactory(tenant=user.tenant, created_at=now - timedelta(hours=2))
    new = JobFactory(tenant=user.tenant, created_at=now)
    JobFactory(tenant=other_tenant)

    response = person_client.get(URL)

    assert response.status_code == 200
    assert ids(response) == [new.id, old.id]


def test_the_list_takes_one_query_however_many_jobs_it_shows(
    person_client, user, django_assert_max_num_queries
):
    for _ in range(6):
        JobFactory(tenant=user.tenant, automation=AutomationFactory())

    # One page by cursor: no count, and ids stand for the automation and the requester.
    with django_assert_max_num_queries(1):
        response = person_client.get(URL)

    assert len(ids(response)) == 6


def test_the_list_pages_with_a_cursor_without_repeats_or_gaps(person_client, user):
    now = timezone.now()
    jobs = [JobFactory(tenant=user.tenant, created_at=now - timedelta(minutes=i)) for i in range(5)]
    # Two jobs created at the same instant are still ordered (by id).
    jobs.append(JobFactory(tenant=user.tenant, created_at=jobs[-1].created_at))

    seen, url = [], f"{URL}?limit=2"
    while url:
        page = person_client.get(url).json()
        seen.extend(item["id"] for item in page["results"])
        url = page["next"]

    assert sorted(seen) == sorted(job.id for job in jobs)
    assert len(seen) == len(set(seen))


def _encoded(fields: str) -> str:
    return base64.b64encode(fields.encode()).decode()


@pytest.mark.parametrize(
    "cursor",
    [
        "not-a-cursor",
        # base64 read leniently: DRF drops what is not of its alphabet, so these were the
        # first page.
        "!!!!",
        "",
        _encoded("garbage"),
        _encoded("o=0&x=1"),
        _encoded("o=0&o=1"),
        _encoded("o=0&p=2026-12-01 09:00:00+00:00") + "!",
        # positions that are not a moment with its offset, or fall off the calendar in UTC
        _encoded("o=0&p=garbage"),
        _encoded("o=0&p=2026-12-01 09:00:00"),
        _encoded("o=0&p=0001-01-01 00:00:00+01:00"),
        _encoded("o=0&p=9999-12-31 23:00:00-02:00"),
        _encoded("r=2&p=2026-12-01 09:00:00+00:00"),
        "\u00e9" + _encoded("o=0"),
    ],
)
def test_a_cursor_the_api_did_not_issue_is_a_400_in_the_error_format(person_client, user, cursor):
    JobFactory.create_batch(3, tenant=user.tenant)

    response = person_client.get(URL, {"cursor": cursor, "limit": 1})

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_a_cursor_with_its_position_and_offset_is_taken(person_client, user):
    now = timezone.now()
    for hours in (3, 2, 1):
        JobFactory(tenant=user.tenant, created_at=now - timedelta(hours=hours))
    second = person_client.get(URL, {"limit": 1}).json()["next"]

    assert second is not None
    response = person_client.get(second)

    assert response.status_code == 200, response.content
    assert len(ids(response)) == 1


def test_the_list_filters_by_status_automation_and_creation_time(person_client, user):
    now = timezone.now()
    automation = AutomationFactory()
    pending = JobFactory(tenant=user.tenant, automation=automation, created_at=now)
    running = RunningJobFactory(tenant=user.tenant, created_at=now - timedelta(days=2))
    JobFactory(tenant=user.tenant, status="failed", created_at=now - timedelta(days=2))

    assert ids(person_client.get(URL, {"status": "pending,running"})) == [pending.id, running.id]
    assert ids(person_client.get(URL, {"automation": automation.id})) == [pending.id]
    since = (now - timedelta(days=1)).isoformat()
    assert ids(person_client.get(URL, {"created_after": since})) == [pending.id]
    assert ids(person_client.get(URL, {"created_before": since, "status": "running"})) == [
        running.id
    ]


@pytest.mark.parametrize(
    "query",
    [
        {"status": "lost"},
        {"automation": "x"},
        {"created_after": "yesterday"},
        {"created_after": "2030-01-02T00:00:00Z", "created_before": "2030-01-01T00:00:00Z"},
    ],
)
def test_a_bad_filter_is_a_400(person_client, query):
    response = person_client.get(URL, query)

    assert response.status_code == 400
    assert response.json()["error"]["code"] == "invalid"


def test_a_job_shows_its_state_timestamps_requester_and_outcome(person_client, user):
    job = JobFactory(
        tenant=user.tenant,
        requested_by=user,
        status="failed",
        attempt=1,
        error="boom",
        output_tail="tail",
        exit_code=2,
        failure_reason="exit_code",
        started_at=timezone.now(),
        finished_at=timezone.now(),
    )

    body = person_client.get(f"{URL}/{job.id}").json()

    assert body["id"] == job.id
    assert body["status"] == "failed"
    assert body["requested_by"] == user.id
    assert body["attempt"] == 1
    assert (body["error"], body["output_tail"], body["exit_code"]) == ("boom", "tail", 2)
    assert body["failure_reason"] == "exit_code"
    for stamp in ("created_at", "started_at", "finished_at", "updated_at"):
        assert body[stamp] is not None
    assert "claim_token" not in body  # the claim is the worker's secret


def test_a_tenant_cannot_see_another_tenants_job(person_client, other_tenant):
    job = JobFactory(tenant=other_tenant)

    response = person_client.get(f"{URL}/{job.id}")

    assert response.status_code == 404
    assert response.json()["error"]["code"] == "job_not_found"


def test_guessing_ids_finds_nothing_of_another_tenant(person_client, other_tenant):
    jobs = JobFactory.create_batch(3, tenant=other_tenant)

    statuses = {person_client.get(f"{URL}/{job.id}").status_code for job in jobs}

    assert statuses == {404}
    assert person_client.get(URL).json()["results"] == []


def test_anonymous_callers_cannot_list_jobs(client):
    assert client.get(URL).status_code == 401


def test_a_job_without_a_failure_sends_a_null_failure_reason_as_documented(person_client, user):
    job = JobFactory(tenant=user.tenant, requested_by=user)
    body = person_client.get(f"/api/v1/jobs/{job.pk}").json()
    assert body["failure_reason"] is None

    schema = SchemaGenerator().get_schema(request=None, public=True)
    failure_reason = schema["components"]["schemas"]["JobOutput"]["properties"]["failure_reason"]
    assert failure_reason["nullable"] is True
