"""The ``ec2`` provider: the worker's machine is an EC2 instance (``machine_id``)."""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings

from automation.machines.base import MachineProvider, MachineState, PowerOn

_STATES = {
    "pending": MachineState.RUNNING,
    "running": MachineState.RUNNING,
    "stopping": MachineState.STOPPING,
    "shutting-down": MachineState.STOPPING,
    "stopped": MachineState.STOPPED,
    "terminated": MachineState.STOPPED,
}


class Ec2Provider(MachineProvider):
    name = "ec2"

    def client(self, worker):
        # Imported here: boto3 is a tenth of a second of every process's start, and only
        # the processes that drive EC2 machines need it.
        import boto3
        from botocore.config import Config

        return boto3.client(
            "ec2",
            region_name=worker.region or settings.AWS_REGION,
            endpoint_url=settings.EC2_ENDPOINT_URL,
            config=Config(connect_timeout=5, read_timeout=20, retries={"mode": "standard"}),
        )

    def power_on(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        client = self.client(worker)
        if self._state(client, worker) == MachineState.RUNNING:
            return PowerOn.ALREADY_RUNNING
        # A stopping instance refuses to start (IncorrectInstanceState): the error is
        # transient and the task's retry comes back once it has stopped.
        client.start_instances(InstanceIds=[worker.machine_id])
        return PowerOn.STARTED

    def restart(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        """A reboot: the instance's worker starts again with the credential the machine is
        configured with. The hub cannot hand a new credential to an EC2 machine: after a
        rotation, whoever provisions the instance installs the new one."""
        client = self.client(worker)
        if self._state(client, worker) != MachineState.RUNNING:
            return self.power_on(worker, issue_credential=issue_credential)
        client.reboot_instances(InstanceIds=[worker.machine_id])
        return PowerOn.STARTED

    def power_off(self, worker) -> None:
        client = self.client(worker)
        if self._state(client, worker) in (MachineState.RUNNING,):
            client.stop_instances(InstanceIds=[worker.machine_id])

    def state(self, worker) -> MachineState:
        return self._state(self.client(worker), worker)

    def _state(self, client, worker) -> MachineState:
        answer = client.describe_instances(InstanceIds=[worker.machine_id])
        for reservation in answer.get("Reservations", []):
            for instance in reservation.get("Instances", []):
                return _STATES.get(instance["State"]["Name"], MachineState.UNKNOWN)
        return MachineState.UNKNOWN
