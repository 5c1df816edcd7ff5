"""Step 3: ec2 machines idle for longer than the setting are stopped; busy ones are not."""

from __future__ import annotations

from datetime import timedelta

import boto3
import pytest
from django.utils import timezone

from automation.models import Worker
from tests.factories import JobFactory, RunningJobFactory, WorkerFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def ec2(settings, moto_endpoint):
    settings.EC2_ENDPOINT_URL = moto_endpoint
    settings.MONITOR_EC2_IDLE_SECONDS = 15 * 60
    return boto3.client("ec2", region_name=settings.AWS_REGION, endpoint_url=moto_endpoint)


@pytest.fixture
def stop_calls():
    """The StopInstances requests boto3 really sends (clients made after this see it)."""
    calls: list[dict] = []
    session = boto3._get_default_session()
    handler = lambda params, **_: calls.append(params["body"])  # noqa: E731
    session.events.register("before-call.ec2.StopInstances", handler)
    yield calls
    session.events.unregister("before-call.ec2.StopInstances", handler)


@pytest.fixture
def machine(ec2):
    """An ec2 worker whose instance runs, last seen ``minutes`` ago."""

    def make(minutes: float) -> Worker:
        image = ec2.describe_images()["Images"][0]["ImageId"]
        instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]
        worker = WorkerFactory(provider="ec2", machine_id=instance["InstanceId"])
        Worker.objects.filter(pk=worker.pk).update(
            status=Worker.Status.ONLINE, last_seen_at=timezone.now() - timedelta(minutes=minutes)
        )
        return worker

    return make


def state_of(ec2, worker) -> str:
    answer = ec2.describe_instances(InstanceIds=[worker.machine_id])
    return answer["Reservations"][0]["Instances"][0]["State"]["Name"]


def test_only_the_idle_machine_is_stopped(monitor, ec2, machine, stop_calls):
    idle = machine(minutes=20)
    recently_seen = machine(minutes=5)

    assert monitor.stop_idle_machines() == 1

    assert [call["InstanceId.1"] for call in stop_calls] == [idle.machine_id]
    assert state_of(ec2, idle) in ("stopping", "stopped")
    assert state_of(ec2, recently_seen) == "running"
    idle.refresh_from_db()
    recently_seen.refresh_from_db()
    assert (idle.status, recently_seen.status) == ("offline", "online")


def test_a_machine_whose_automation_has_work_is_not_stopped(monitor, ec2, machine, stop_calls):
    waiting = machine(minutes=60)
    JobFactory(automation=waiting.automation)
    running = machine(minutes=60)
    RunningJobFactory(automation=running.automation)

    assert monitor.stop_idle_machines() == 0

    assert stop_calls == []
    assert (state_of(ec2, waiting), state_of(ec2, running)) == ("running", "running")


def test_finished_jobs_do_not_keep_a_machine_up(monitor, ec2, machine, stop_calls):
    idle = machine(minutes=60)
    JobFactory(automation=idle.automation, status="succeeded")

    assert monitor.stop_idle_machines() == 1
    assert [call["InstanceId.1"] for call in stop_calls] == [idle.machine_id]


def believed_off(worker: Worker, minutes: float) -> None:
    """The hub's row says the machine is off, written ``minutes`` ago."""
    Worker.objects.filter(pk=worker.pk).update(
        status=Worker.Status.OFFLINE, updated_at=timezone.now() - timedelta(minutes=minutes)
    )


def test_a_machine_running_while_its_row_says_offline_is_stopped_once_idle(
    monitor, ec2, machine, stop_calls
):
    # Started from outside the hub (a console, a stop that did not take), its worker
    # never heard from: the row's belief alone would leave it running for ever.
    forgotten = machine(minutes=60)
    believed_off(forgotten, minutes=20)

    assert monitor.stop_idle_machines() == 1

    assert [call["InstanceId.1"] for call in stop_calls] == [forgotten.machine_id]
    assert state_of(ec2, forgotten) in ("stopping", "stopped")


def test_an_offline_row_is_probed_once_an_idle_time(monitor, ec2, machine, stop_calls):
    really_off = machine(minutes=60)
    ec2.stop_instances(InstanceIds=[really_off.machine_id])
    believed_off(really_off, minutes=20)
    recently_written = machine(minutes=60)
    believed_off(recently_written, minutes=5)
    described: list[dict] = []
    session = boto3._get_default_session()
    handler = lambda params, **_: described.append(params["body"])  # noqa: E731
    session.events.register("before-call.ec2.DescribeInstances", handler)
    try:
        assert monitor.stop_idle_machines() == 0
        assert monitor.stop_idle_machines() == 0
    finally:
        session.events.unregister("before-call.ec2.DescribeInstances", handler)

    # The stopped one asked about once, then not before another idle time; the one whose
    # row was written lately not at all.
    assert [call["InstanceId.1"] for call in described] == [really_off.machine_id]
    assert stop_calls == []
    really_off.refresh_from_db()
    assert really_off.status == "offline"
    assert timezone.now() - really_off.updated_at < timedelta(minutes=1)


def test_the_power_on_of_a_machine_found_running_starts_the_idle_clock(
    monitor, ec2, machine, stop_calls
):
    from automation.machines.services import machine_power_on

    found_running = machine(minutes=60)
    believed_off(found_running, minutes=60)
    machine_power_on(automation_id=found_running.automation_id)
    found_running.refresh_from_db()
    assert found_running.status == "starting"

    # Its idle time counts from the power-on, not from when it was last seen.
    assert monitor.stop_idle_machines() == 0
    assert stop_calls == []
    Worker.objects.filter(pk=found_running.pk).update(
        updated_at=timezone.now() - timedelta(minutes=20)
    )
    assert monitor.stop_idle_machines() == 1


def test_a_job_that_comes_during_the_sweep_keeps_its_machine_up(
    monitor, ec2, machine, stop_calls, monkeypatch
):
    from automation.machines import services

    idle = machine(minutes=60)
    real = services._runs_after_all

    def a_job_comes_meanwhile(provider, worker):
        JobFactory(automation=worker.automation)
        return real(provider, worker)

    believed_off(idle, minutes=20)
    monkeypatch.setattr(services, "_runs_after_all", a_job_comes_meanwhile)

    assert monitor.stop_idle_machines() == 0
    assert stop_calls == []
    assert state_of(ec2, idle) == "running"


def test_an_offline_row_whose_machine_is_gone_is_asked_about_an_idle_time_later(
    monitor, ec2, machine, stop_calls, caplog
):
    gone = machine(minutes=60)
    Worker.objects.filter(pk=gone.pk).update(machine_id="i-0123456789abcdef0")
    believed_off(gone, minutes=20)

    assert monitor.stop_idle_machines() == 0
    assert monitor.stop_idle_machines() == 0

    assert stop_calls == []
    assert [r.message for r in caplog.records if "could not ask" in r.message] == [
        f"automation {gone.automation_id}: could not ask for its machine's state"
    ]
    gone.refresh_from_db()
    assert gone.status == "offline"
