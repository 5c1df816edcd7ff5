"""Automation use cases: the automation and its worker change together, with their events."""

from __future__ import annotations

from unittest import mock

import pytest
from django.db import IntegrityError
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from automation.authentication import CREDENTIAL_PREFIX, WorkerAuthentication, hash_credential
from automation.models import Automation, Worker
from automation.services import (
    automation_create,
    automation_deactivate,
    automation_update,
    worker_rotate_credential,
)
from common.errors import Conflict, InvalidInput
from outbox.models import Event, PlatformOutboxMessage, TaskRun
from tests.factories import AutomationWithWorkerFactory, SectorFactory

pytestmark = pytest.mark.django_db


def authenticate(credential: str):
    request = Request(APIRequestFactory().get("/", HTTP_AUTHORIZATION=f"Bearer {credential}"))
    return WorkerAuthentication().authenticate(request)


def create(actor, sector, **overrides):
    fields = {"name": "Invoice export", "sector_id": sector.id, "command": ["python", "run.py"]}
    return automation_create(**{**fields, **overrides}, actor=actor)


def nothing_written() -> bool:
    return not (
        Automation.objects.exists()
        or Worker.objects.exists()
        or Event.objects.exists()
        or PlatformOutboxMessage.objects.exists()
        or TaskRun.objects.exists()
    )


def test_creating_an_automation_creates_its_worker_and_both_events(platform_admin, sector):
    created = create(
        platform_admin,
        sector,
        provider="ec2",
        machine_id="i-0123456789abcdef0",
        region="sa-east-1",
        params_schema={"type": "object", "required": ["month"]},
    )

    automation = created.automation
    assert automation.slug == "invoice-export"
    worker = Worker.objects.get(automation=automation)
    assert worker.machine() == ("ec2", "i-0123456789abcdef0", "sa-east-1")
    assert worker.status == Worker.Status.OFFLINE and worker.is_active

    recorded = list(Event.objects.order_by("id"))
    assert [e.type for e in recorded] == ["AutomationCreated", "WorkerRegistered"]
    for event in recorded:
        # Worker events are events of the automation.
        assert (event.aggregate_type, event.aggregate_id) == ("Automation", str(automation.id))
        assert event.actor == f"user:{platform_admin.id}" and event.tenant_id is None
        assert event.payload["automation_id"] == automation.id
    assert recorded[1].payload["worker_id"] == worker.id
    # AutomationCreated provisions the automation's own queue.
    (row,) = PlatformOutboxMessage.objects.all()
    assert row.envelope["task"] == "automation.provision_queue"
    assert row.envelope["payload"]["automation_id"] == automation.id


def test_the_credential_is_returned_once_and_only_its_hash_is_stored(platform_admin, sector):
    created = create(platform_admin, sector)

    worker = Worker.objects.get()
    assert created.credential.startswith(CREDENTIAL_PREFIX)
    assert worker.credential_hash == hash_credential(created.credential)
    assert worker.credential_prefix == created.credential[:12]
    assert created.credential not in str(Worker.objects.values().get())
    assert authenticate(created.credential)[0] == worker


@pytest.mark.django_db(transaction=True)
def test_a_failure_while_creating_the_worker_leaves_no_automation_and_no_event(
    platform_admin,
):
    sector = SectorFactory()
    existing = AutomationWithWorkerFactory(sector=sector)
    before = (Automation.objects.count(), Worker.objects.count())

    # A credential already in use: the worker insert breaks the unique index, for real.
    with (
        mock.patch("automation.services.new_credential", return_value=existing.credential),
        pytest.raises(IntegrityError),
    ):
        create(platform_admin, sector, slug="second")

    assert (Automation.objects.count(), Worker.objects.count()) == before
    assert not Automation.objects.filter(slug="second").exists()
    assert not Event.objects.exists() and not PlatformOutboxMessage.objects.exists()
    assert not TaskRun.objects.exists()


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_concurrency": 2**31}, "max_concurrency"),
        ({"command": []}, "command"),
        ({"command": "python run.py"}, "command"),
        ({"command": ["python", ""]}, "command"),
        ({"command": ["python", 3]}, "command"),
        ({"params_schema": {"type": "no-such-type"}}, "params_schema"),
        ({"params_schema": {"minLength": -1}}, "params_schema"),
        ({"params_schema": ["not", "an", "object"]}, "params_schema"),
        ({"name": " "}, "name"),
        ({"slug": "not a slug"}, "slug"),
        ({"provider": "gcp"}, "provider"),
        ({"provider": "ec2", "machine_id": ""}, "machine_id"),
        ({"sector_id": 999_999}, "sector"),
    ],
)
def test_invalid_input_is_refused_and_writes_nothing(platform_admin, sector, overrides, field):
    with pytest.raises(InvalidInput) as refused:
        create(platform_admin, sector, **overrides)

    assert field in refused.value.details
    assert nothing_written()


def test_an_automation_cannot_be_filed_under_a_retired_sector(platform_admin):
    retired = SectorFactory(is_active=False)

    with pytest.raises(InvalidInput) as refused:
        create(platform_admin, retired)

    assert refused.value.details == {"sector": ["The sector is not active."]}
    assert nothing_written()


def test_a_slug_in_use_is_a_conflict(platform_admin, sector):
    AutomationWithWorkerFactory(slug="invoice-export")

    with pytest.raises(Conflict) as refused:
        create(platform_admin, sector)

    assert refused.value.code == "automation_slug_taken"
    assert not Event.objects.exists()


def test_updating_fields_records_automation_updated_once(platform_admin, automation, events):
    other = SectorFactory()
    updated = automation_update(
        automation_id=automation.id,
        data={"max_concurrency": 3, "sector_id": other.id, "command": ["bash", "x.sh"]},
        actor=platform_admin,
    )

    assert (updated.max_concurrency, updated.sector_id) == (3, other.id)
    assert events() == ["AutomationUpdated"]
    event = Event.objects.get()
    assert event.payload["changed"] == ["command", "max_concurrency", "sector"]
    assert event.payload["automation_id"] == automation.id


def test_changing_the_machine_re_registers_the_worker(platform_admin, automation, events):
    Worker.objects.filter(automation=automation).update(status="online")

    automation_update(
        automation_id=automation.id,
        machine={"provider": "ec2", "machine_id": "i-0123456789abcdef0"},
        actor=platform_admin,
    )

    worker = Worker.objects.get(automation=automation)
    assert worker.machine() == ("ec2", "i-0123456789abcdef0", "")
    assert worker.status == Worker.Status.OFFLINE  # a new machine: nothing known about it yet
    assert events() == ["WorkerRegistered"]
    event = Event.objects.get()
    assert (event.aggregate_type, event.aggregate_id) == ("Automation", str(automation.id))
    assert event.payload["provider"] == "ec2"


def test_changing_fields_and_machine_together_records_both_events(
    platform_admin, automation, events
):
    automation_update(
        automation_id=automation.id,
        data={"name": "Renamed"},
        machine={"region": "us-west-2"},
        actor=platform_admin,
    )

    assert events() == ["AutomationUpdated", "WorkerRegistered"]


def test_an_update_that_changes_nothing_records_no_event(platform_admin, automation, events):
    automation_update(
        automation_id=automation.id,
        data={"name": automation.name, "command": automation.command},
        machine={"provider": "local"},
        actor=platform_admin,
    )

    assert events() == []


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"command": []}, "command"),
        ({"params_schema": {"type": 12}}, "params_schema"),
        ({"sector_id": 999_999}, "sector"),
        ({"slug": ""}, "slug"),
        ({"worker_id": 1}, "worker_id"),
    ],
)
def test_a_refused_update_changes_nothing_and_records_no_event(
    platform_admin, automation, events, data, field
):
    with pytest.raises(InvalidInput) as refused:
        automation_update(automation_id=automation.id, data=data, actor=platform_admin)

    assert field in refused.value.details
    assert events() == []
    fresh = Automation.objects.get(pk=automation.pk)
    assert (fresh.max_concurrency, fresh.command, fresh.slug) == (
        automation.max_concurrency,
        automation.command,
        automation.slug,
    )


def test_an_automation_cannot_move_to_a_retired_sector(platform_admin, automation, events):
    retired = SectorFactory(is_active=False)

    with pytest.raises(InvalidInput):
        automation_update(
            automation_id=automation.id, data={"sector_id": retired.id}, actor=platform_admin
        )

    assert events() == []


def test_deactivating_retires_the_automation_and_its_worker(platform_admin, automation, events):
    retired = automation_deactivate(automation_id=automation.id, actor=platform_admin)

    worker = Worker.objects.get(automation=automation)
    assert not retired.is_active and retired.deactivated_at is not None
    assert not worker.is_active and worker.status == Worker.Status.DEACTIVATED
    assert events() == ["AutomationDeactivated", "WorkerDeactivated"]
    assert {e.aggregate_id for e in Event.objects.all()} == {str(automation.id)}
    # A retired worker's credential no longer opens anything.
    with pytest.raises(AuthenticationFailed):
        authenticate(automation.credential)


def test_a_retired_automation_refuses_changes_without_events(platform_admin, automation, events):
    automation_deactivate(automation_id=automation.id, actor=platform_admin)

    for change in (
        lambda: automation_deactivate(automation_id=automation.id, actor=platform_admin),
        lambda: automation_update(
            automation_id=automation.id, data={"name": "x"}, actor=platform_admin
        ),
        lambda: worker_rotate_credential(automation_id=automation.id, actor=platform_admin),
    ):
        with pytest.raises(Conflict) as refused:
            change()
        assert refused.value.code == "automation_inactive"
    assert events() == ["AutomationDeactivated", "WorkerDeactivated"]


def test_the_rotated_credential_authenticates_and_the_old_one_stops_working(
    platform_admin, automation
):
    old = automation.credential
    assert authenticate(old)[0].automation_id == automation.id

    rotated = worker_rotate_credential(automation_id=automation.id, actor=platform_admin)

    assert rotated.credential != old
    assert authenticate(rotated.credential)[0] == rotated.worker
    assert rotated.worker.credential_rotated_at is not None
    with pytest.raises(AuthenticationFailed):
        authenticate(old)
