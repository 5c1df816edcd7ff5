"""Machine providers: EC2 against moto's server on loopback, local as real processes."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import boto3
import pytest

from automation.machines import MachineState, PowerOn, provider_for
from automation.machines.ec2 import Ec2Provider
from automation.machines.local import LocalProvider
from tests.machines.stand_in import started
from tests.polling import wait_until


def worker(provider: str, *, slug: str = "demo", machine_id: str = "", region: str = ""):
    """A worker as the providers read it (they touch no other field)."""
    return SimpleNamespace(
        provider=provider,
        machine_id=machine_id,
        region=region,
        automation=SimpleNamespace(slug=slug),
    )


@pytest.fixture
def ec2(settings, moto_endpoint):
    settings.EC2_ENDPOINT_URL = moto_endpoint
    return boto3.client("ec2", region_name="us-east-1", endpoint_url=moto_endpoint)


@pytest.fixture
def stopped_instance(ec2) -> str:
    image = ec2.describe_images()["Images"][0]["ImageId"]
    instance = ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1)["Instances"][0]
    ec2.stop_instances(InstanceIds=[instance["InstanceId"]])
    return instance["InstanceId"]


def count_calls(provider: Ec2Provider, operation: str) -> list[dict]:
    """Record the StartInstances/StopInstances requests the provider's client really sends."""
    calls: list[dict] = []
    original = provider.client

    def client(worker):
        made = original(worker)
        made.meta.events.register(
            f"before-call.ec2.{operation}", lambda params, **_: calls.append(params["body"])
        )
        return made

    provider.client = client
    return calls


def test_ec2_power_on_starts_the_right_instance_once(ec2, stopped_instance):
    provider = Ec2Provider()
    calls = count_calls(provider, "StartInstances")
    machine = worker("ec2", machine_id=stopped_instance, region="us-east-1")

    assert provider.power_on(machine) == PowerOn.STARTED
    assert provider.power_on(machine) == PowerOn.ALREADY_RUNNING

    assert len(calls) == 1
    assert calls[0]["InstanceId.1"] == stopped_instance
    state = ec2.describe_instances(InstanceIds=[stopped_instance])["Reservations"][0]["Instances"][
        0
    ]
    assert state["State"]["Name"] in ("pending", "running")
    assert provider.state(machine) == MachineState.RUNNING


def test_ec2_power_off_stops_a_running_instance(ec2, stopped_instance):
    provider = Ec2Provider()
    machine = worker("ec2", machine_id=stopped_instance)
    provider.power_on(machine)
    provider.power_off(machine)
    assert provider.state(machine) in (MachineState.STOPPED, MachineState.STOPPING)


def test_ec2_restart_reboots_a_running_instance_and_starts_a_stopped_one(ec2, stopped_instance):
    provider = Ec2Provider()
    reboots = count_calls(provider, "RebootInstances")
    starts = count_calls(provider, "StartInstances")
    machine = worker("ec2", machine_id=stopped_instance, region="us-east-1")

    assert provider.restart(machine) == PowerOn.STARTED  # stopped: started
    assert (len(starts), len(reboots)) == (1, 0)
    assert provider.restart(machine) == PowerOn.STARTED  # running: rebooted
    assert (len(starts), len(reboots)) == (1, 1)
    assert reboots[0]["InstanceId.1"] == stopped_instance


def test_provider_for_picks_by_the_workers_provider():
    assert isinstance(provider_for(worker("local")), LocalProvider)
    assert isinstance(provider_for(worker("ec2")), Ec2Provider)
    with pytest.raises(ValueError, match="unknown machine provider"):
        provider_for(worker("gcp"))


def test_local_power_on_starts_one_detached_worker_with_its_credential(fake_worker_command):
    provider = LocalProvider()
    machine = worker("local", slug="invoices")
    assert provider.state(machine) == MachineState.STOPPED

    assert provider.power_on(machine, issue_credential=lambda: "hdw_first") == PowerOn.STARTED
    assert wait_until(lambda: started(fake_worker_command))
    assert provider.state(machine) == MachineState.RUNNING
    # Idempotent: the running worker holds the machine's lock.
    assert (
        provider.power_on(machine, issue_credential=lambda: "hdw_second") == PowerOn.ALREADY_RUNNING
    )
    assert started(fake_worker_command) == ["['run_worker', '--automation', 'invoices'] hdw_first"]


def test_concurrent_local_power_ons_start_a_single_worker(fake_worker_command):
    provider = LocalProvider()
    machine = worker("local", slug="race")
    results: list[PowerOn] = []
    barrier = threading.Barrier(8)

    def power_on():
        barrier.wait()
        results.append(provider.power_on(machine, issue_credential=lambda: "hdw_x"))

    threads = [threading.Thread(target=power_on) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    # Every power-on has returned, and only one spawned a process (STARTED is returned
    # after the spawn): that one process writes its line.
    assert sorted(results).count(PowerOn.STARTED) == 1
    assert wait_until(lambda: started(fake_worker_command))
    assert len(started(fake_worker_command)) == 1


def test_when_the_local_worker_exits_the_machine_is_stopped_and_can_start_again(
    fake_worker_command,
):
    provider = LocalProvider()
    machine = worker("local", slug="again")
    provider.power_on(machine, issue_credential=lambda: "hdw_1")
    assert wait_until(lambda: provider.state(machine) == MachineState.RUNNING)
    (fake_worker_command / "stop").write_text("")
    assert wait_until(lambda: provider.state(machine) == MachineState.STOPPED)
    (fake_worker_command / "stop").unlink()
    assert provider.power_on(machine, issue_credential=lambda: "hdw_2") == PowerOn.STARTED
    assert wait_until(lambda: len(started(fake_worker_command)) == 2)


def test_local_power_on_needs_a_credential(fake_worker_command):
    machine = worker("local", slug="nocred")
    with pytest.raises(ValueError, match="credential"):
        LocalProvider().power_on(machine)
    # A process spawned before the refusal would hold the machine's lock from birth,
    # written its line or not: the machine would be running.
    assert LocalProvider().state(machine) == MachineState.STOPPED
    assert not (fake_worker_command / "starts").exists()
