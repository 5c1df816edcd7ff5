"""A job's public shape (``job.selectors.job_public``): what the job API answers, field
for field what its schema documents, in the format the API has always used."""

from __future__ import annotations

import json
import re

import pytest
from rest_framework.fields import DateTimeField

from job.api.serializers import JobOutput
from job.selectors import job_public
from tests.factories import JobFactory, RunningJobFactory

pytestmark = pytest.mark.django_db

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def test_the_api_answers_a_job_in_its_public_shape_with_the_fields_its_schema_names(
    person_client, user
):
    job = RunningJobFactory(tenant=user.tenant)

    body = person_client.get(f"/api/v1/jobs/{job.id}").json()

    job.refresh_from_db()
    assert body == json.loads(json.dumps(job_public(job)))
    assert list(body) == list(JobOutput().fields)


def test_times_are_written_as_drf_writes_them_and_a_missing_failure_reason_is_null(user):
    job = RunningJobFactory(tenant=user.tenant)
    pending = JobFactory(tenant=user.tenant)

    shape = job_public(job)

    for field in ("created_at", "started_at", "last_heartbeat_at", "updated_at"):
        assert shape[field] == DateTimeField().to_representation(getattr(job, field))
        assert ISO_UTC.match(shape[field]), shape[field]
    assert job_public(pending)["started_at"] is None
    assert job_public(pending)["failure_reason"] is None
