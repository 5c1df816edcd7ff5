"""machines.power_on and the worker's own endpoint, against the real database."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from automation.authentication import hash_credential
from automation.machines import PowerOn
from automation.machines.services import machine_power_on
from automation.models import Worker
from tests.factories import AutomationFactory, WorkerFactory
from tests.machines.stand_in import started
from tests.polling import wait_until

pytestmark = pytest.mark.django_db


def test_power_on_starts_a_local_machine_with_a_fresh_credential(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="reports"))
    old_hash = worker.credential_hash

    assert machine_power_on(automation_id=worker.automation_id) == PowerOn.STARTED
    assert wait_until(lambda: started(fake_worker_command))

    worker.refresh_from_db()
    assert worker.status == Worker.Status.STARTING
    assert worker.credential_hash != old_hash
    # The process got the credential that now authenticates, and only the hash is stored.
    credential = started(fake_worker_command)[0].split("] ")[1]
    assert hash_credential(credential) == worker.credential_hash


def test_power_on_of_a_running_machine_changes_nothing(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="twice"))
    machine_power_on(automation_id=worker.automation_id)
    worker.refresh_from_db()
    credential_after_first = worker.credential_hash

    assert machine_power_on(automation_id=worker.automation_id) == PowerOn.ALREADY_RUNNING
    worker.refresh_from_db()
    # No rotation either: the running worker's credential keeps working.
    assert worker.credential_hash == credential_after_first


def test_power_on_ignores_an_inactive_automation(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="retired", is_active=False))
    assert machine_power_on(automation_id=worker.automation_id) is None
    assert not (fake_worker_command / "starts").exists()


def test_the_worker_reads_its_automation_and_is_seen():
    automation = AutomationFactory(command=["python", "job.py"], max_concurrency=3)
    worker = WorkerFactory(automation=automation)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {worker.credential}")

    response = api.get("/api/v1/worker/me")

    assert response.status_code == 200
    assert response.json() == {
        "worker": worker.id,
        "automation": {
            "id": automation.id,
            "slug": automation.slug,
            "name": automation.name,
            "command": ["python", "job.py"],
            "timeout_seconds": automation.timeout_seconds,
            "max_concurrency": 3,
        },
    }
    worker.refresh_from_db()
    assert worker.status == Worker.Status.ONLINE and worker.last_seen_at is not None


def test_people_cannot_use_the_worker_endpoint(user):
    api = APIClient()
    api.force_authenticate(user)
    assert api.get("/api/v1/worker/me").status_code in (401, 403)
