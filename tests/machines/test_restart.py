"""A worker that cannot work is restarted: after a credential rotation at once, and by the
monitor when it stays silent while its automation has jobs waiting."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from automation.agent.client import AutomationInfo, HubClient
from automation.agent.worker import AutomationWorker
from automation.authentication import hash_credential
from automation.machines import MachineState, PowerOn
from automation.machines.local import LocalProvider
from automation.machines.services import machine_power_on, machine_restart
from automation.models import Worker
from automation.services import worker_rotate_credential
from outbox.models import PlatformOutboxMessage
from tests.factories import AutomationFactory, WorkerFactory
from tests.machines.stand_in import started
from tests.polling import wait_until


def restarts() -> list[dict]:
    return [
        row.envelope["payload"]
        for row in PlatformOutboxMessage.objects.filter(envelope__task="machines.restart")
    ]


@pytest.mark.django_db
def test_restart_stops_the_running_worker_and_starts_one_with_a_fresh_credential(
    fake_worker_command,
):
    worker = WorkerFactory(automation=AutomationFactory(slug="stranded"))
    assert machine_power_on(automation_id=worker.automation_id) == PowerOn.STARTED
    assert wait_until(lambda: len(started(fake_worker_command)) == 1)
    first_pid = int((fake_worker_command.parent / "machines" / "stranded.pid").read_text())

    assert machine_restart(automation_id=worker.automation_id) == PowerOn.STARTED

    assert wait_until(lambda: len(started(fake_worker_command)) == 2)
    old, new = (line.split("] ")[1] for line in started(fake_worker_command))
    assert old != new
    worker.refresh_from_db()
    assert hash_credential(new) == worker.credential_hash
    second_pid = int((fake_worker_command.parent / "machines" / "stranded.pid").read_text())
    assert second_pid != first_pid
    assert LocalProvider().state(worker) == MachineState.RUNNING


@pytest.mark.django_db
def test_restart_of_a_stopped_machine_on_rotation_starts_nothing(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="asleep"))

    assert machine_restart(automation_id=worker.automation_id, only_running=True) is None

    assert started(fake_worker_command) == []


@pytest.mark.django_db(transaction=True)
def test_rotating_the_credential_asks_for_a_restart_in_the_same_transaction(platform_admin):
    worker = WorkerFactory()

    with pytest.raises(RuntimeError), transaction.atomic():
        worker_rotate_credential(automation_id=worker.automation_id, actor=platform_admin)
        raise RuntimeError("rolled back")
    assert restarts() == []

    worker_rotate_credential(automation_id=worker.automation_id, actor=platform_admin)

    assert restarts() == [{"automation_id": worker.automation_id}]


@pytest.mark.django_db
def test_the_credential_a_power_on_issues_asks_for_no_restart(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="fresh"))

    machine_power_on(automation_id=worker.automation_id)

    assert restarts() == []


@pytest.mark.django_db
def test_a_worker_heard_from_since_the_monitor_looked_is_not_restarted(fake_worker_command):
    worker = WorkerFactory(automation=AutomationFactory(slug="alive"))
    machine_power_on(automation_id=worker.automation_id)
    assert wait_until(lambda: len(started(fake_worker_command)) == 1)
    looked = timezone.now() - timedelta(seconds=30)
    Worker.objects.filter(pk=worker.pk).update(last_seen_at=timezone.now())

    assert machine_restart(automation_id=worker.automation_id, silent_since=looked) is None

    assert len(started(fake_worker_command)) == 1


@pytest.mark.django_db
def test_the_workers_poll_counts_as_being_heard_from():
    from tests.job.support import worker_client

    worker = WorkerFactory()
    long_ago = timezone.now() - timedelta(minutes=5)
    Worker.objects.filter(pk=worker.pk).update(last_seen_at=long_ago, updated_at=long_ago)

    assert worker_client(worker).get("/api/v1/worker/jobs").status_code == 200

    worker.refresh_from_db()
    assert worker.last_seen_at > long_ago


@pytest.mark.django_db(transaction=True)
def test_a_worker_whose_credential_was_rotated_stops(live_server, platform_admin):
    worker = WorkerFactory()
    automation = worker.automation
    worker_rotate_credential(automation_id=automation.id, actor=platform_admin)
    client = HubClient(live_server.url, worker.credential)
    agent = AutomationWorker(
        client,
        AutomationInfo(automation.id, automation.slug, ["true"], 30, 1),
        poll_interval=0.2,
    )
    runner = threading.Thread(target=agent.run, daemon=True)
    runner.start()
    runner.join(15)
    stopped = not runner.is_alive()
    agent.shutdown.set()
    client.close()

    assert stopped, "the worker went on polling with a credential the hub refuses"
    assert agent.credential_refused
