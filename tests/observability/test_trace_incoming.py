"""A caller's ``traceparent`` header: a valid one is joined (W3C Trace Context), anything
else is ignored, the request served as if it had none and the job given a trace of its own,
never one the header named."""

from __future__ import annotations

import pytest

from common import tracing
from job.models import Job
from tests.clients import client_of
from tests.factories import AutomationFactory
from tests.observability.test_tracing import spans  # noqa: F401

pytestmark = pytest.mark.django_db

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


def create_job(user, **headers):
    response = client_of(user, token=True, raise_request_exception=False).post(
        "/api/v1/jobs",
        {"automation": AutomationFactory().id, "params": {}},
        format="json",
        **headers,
    )
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["id"])


def test_a_valid_incoming_traceparent_is_joined(spans, user):  # noqa: F811
    job = create_job(user, HTTP_TRACEPARENT=f"00-{TRACE}-{SPAN}-01")

    assert tracing.trace_id_of(job.traceparent) == TRACE


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        "",
        f"00-{'0' * 32}-{SPAN}-01",  # an all-zero trace id
        f"00-{TRACE}-{'0' * 16}-01",  # an all-zero span id
        f"ff-{TRACE}-{SPAN}-01",  # the version that is never valid
        f"00-{TRACE}-{SPAN}-01-extra",  # version 00 has exactly four fields
        f"00-{TRACE.upper()}-{SPAN}-01",  # hex is lowercase
        f"00-{TRACE[:-1]}g-{SPAN}-01",
        f"00-{TRACE}-{SPAN}",
        f"00-{TRACE}-{SPAN}-01" + " " * 10 + "x" * 60_000,  # huge
        f"0-{TRACE}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-1",
        f"00_{TRACE}_{SPAN}_01",
        "\u00e9" * 55,
    ],
)
def test_a_bad_incoming_traceparent_is_ignored(spans, user, header):  # noqa: F811
    job = create_job(user, HTTP_TRACEPARENT=header)

    trace = tracing.trace_id_of(job.traceparent)
    assert tracing.context_of(job.traceparent) is not None, job.traceparent
    assert trace not in (TRACE, TRACE.upper(), "0" * 32)
    assert trace not in header
