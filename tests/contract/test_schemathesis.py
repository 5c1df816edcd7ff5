"""The API against its own OpenAPI schema, as each kind of caller, through the whole stack.

Schemathesis reads the schema the API serves (/api/schema/) and, for every operation,
generates requests, valid and invalid, from it; each one goes through Django's WSGI
application (every middleware, DRF, the real database) as an anonymous caller, a platform
admin, a tenant manager, a tenant member and an automation's worker. Every answer must be
no 5xx, with a documented status code, content type and body.

Random ids would mostly find nothing: each example is also sent with the ids of its path
and body pointing at rows seeded for the test (a tenant and its people, a sector, an
automation with its worker, a pending job, a running job and its claim token, a finished
job), so that the deep paths (a job's creation, claim, reports and re-run, a user's
registration and update, an automation's deactivation) are reached as well.

Bounded (few examples, derandomized, no shrinking) so that it stays a few minutes of CI.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.db import close_old_connections
from django.test import override_settings
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from hubdommed.wsgi import application
from schedule.services import schedule_create
from tests.factories import (
    AutomationWithWorkerFactory,
    JobFactory,
    ManagerFactory,
    PlatformAdminFactory,
    RunningJobFactory,
    SectorFactory,
    TenantFactory,
    UserFactory,
    bearer,
)
from webhook.services import endpoint_create

pytestmark = pytest.mark.django_db

# Schemathesis' WSGI client calls the application "localhost".
HOSTS = ["localhost", "testserver"]

with override_settings(ALLOWED_HOSTS=HOSTS):
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", application)

ROLES = ["anonymous", "platform_admin", "manager", "member", "worker"]
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]
EXAMPLES = 6


@dataclass
class Seeded:
    headers: dict[str, dict[str, str]]
    # Path parameters and body fields that name a row -> the seeded row's id.
    ids: dict[str, object]
    # The worker's reports (heartbeat, complete, fail) go to a running job, with its claim.
    running_job_id: int
    # A re-run is of a finished job.
    finished_job_id: int

    def point_at_seeded_rows(self, case) -> bool:
        """Make the case's ids name the seeded rows; whether anything changed."""
        changed = False
        ids = dict(self.ids)
        if case.path.endswith(("/heartbeat", "/complete", "/fail")):
            ids["job_id"] = self.running_job_id
        if case.path.endswith("/rerun"):
            ids["job_id"] = self.finished_job_id
        for name, value in case.path_parameters.items():
            if name in ids and isinstance(value, int) and value != ids[name]:
                case.path_parameters[name] = ids[name]
                changed = True
        if isinstance(case.body, dict):
            for name in ("automation", "sector", "tenant", "claim_token"):
                # Only where the generated value had the right type: an invalid one is the
                # point of a negative example.
                value = case.body.get(name)
                if type(value) is type(ids[name]) and value != ids[name]:
                    case.body[name] = ids[name]
                    changed = True
        return changed


@pytest.fixture(autouse=True)
def _keep_the_test_transaction():
    # Django closes a connection in a transaction at the end of each request; the test's
    # transaction must outlive the requests (Django's test client does the same).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def seeded(settings) -> Seeded:
    settings.ALLOWED_HOSTS = HOSTS
    tenant = TenantFactory()
    admin = PlatformAdminFactory()
    manager = ManagerFactory(tenant=tenant)
    member = UserFactory(tenant=tenant)
    sector = SectorFactory()
    automation = AutomationWithWorkerFactory(sector=sector, max_concurrency=5)
    pending = JobFactory(tenant=tenant, automation=automation, requested_by=member)
    running = RunningJobFactory(tenant=tenant, automation=automation, requested_by=member)
    finished = JobFactory(
        tenant=tenant, automation=automation, requested_by=member, status="succeeded"
    )
    schedule = schedule_create(
        tenant=tenant, actor=manager, automation_id=automation.pk, name="nightly", cron="0 6 * * *"
    )
    endpoint = endpoint_create(
        tenant=tenant,
        url="https://hooks.example.com/hub",
        event_types=["JobCompleted"],
        actor=manager,
    )
    return Seeded(
        headers={
            "anonymous": {},
            "platform_admin": {"Authorization": bearer(admin)},
            "manager": {"Authorization": bearer(manager)},
            "member": {"Authorization": bearer(member)},
            "worker": {"Authorization": f"Bearer {automation.credential}"},
        },
        ids={
            "tenant_id": tenant.pk,
            "user_id": member.pk,
            "sector_id": sector.pk,
            "automation_id": automation.pk,
            "job_id": pending.pk,
            "schedule_id": schedule.pk,
            "endpoint_id": endpoint.pk,
            "tenant": tenant.pk,
            "sector": sector.pk,
            "automation": automation.pk,
            "claim_token": str(running.claim_token),
        },
        running_job_id=running.pk,
        finished_job_id=finished.pk,
    )


@schema.parametrize()
@pytest.mark.parametrize("role", ROLES)
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    # Derandomized runs have nothing to replay: no example database in the checkout.
    database=None,
    deadline=None,
    # No shrinking: a failure is reported as found, which keeps the run bounded.
    phases=[Phase.explicit, Phase.generate],
    # The seeded rows are shared by the examples of one test on purpose.
    suppress_health_check=list(HealthCheck),
)
def test_the_api_answers_as_its_schema_says(case, role, seeded):
    headers = seeded.headers[role]
    case.call_and_validate(headers=headers, checks=CHECKS)
    if seeded.point_at_seeded_rows(case):
        case.call_and_validate(headers=headers, checks=CHECKS)
