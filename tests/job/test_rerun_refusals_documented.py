"""Each refusal of POST /api/v1/jobs/{id}/rerun carries a code its operation's schema
names: a caller can tell what to do from the documentation alone."""

from __future__ import annotations

import pytest
from drf_spectacular.generators import SchemaGenerator

from identity.models import Tenant
from identity.services import tenant_deactivate
from job.models import Job
from tests.clients import client_of
from tests.factories import JobFactory, PlatformAdminFactory

pytestmark = pytest.mark.django_db

PATH = "/api/v1/jobs/{job_id}/rerun"


def documented(status: int) -> str:
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return schema["paths"][PATH]["post"]["responses"][str(status)]["description"]


def test_a_tenant_deactivated_while_the_request_ran_is_a_documented_409(user):
    job = JobFactory(tenant=user.tenant, status=Job.Status.FAILED)
    # The caller was authenticated (their tenant active) before the deactivation
    # committed (its tenant, loaded then, still active): the request is past its
    # permission when the service looks.
    client = client_of(user)
    tenant_deactivate(tenant=Tenant.objects.get(pk=user.tenant_id), actor=PlatformAdminFactory())

    response = client.post(PATH.format(job_id=job.id))

    assert response.status_code == 409, response.json()
    code = response.json()["error"]["code"]
    assert code == "tenant_inactive"
    assert f"`{code}`" in documented(409)
    assert not Job.objects.filter(rerun_of=job).exists()
