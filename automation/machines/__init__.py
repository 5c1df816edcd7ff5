"""Machines: where an automation's worker runs, behind one small interface.

A worker record names its machine by provider and the provider's id for it:

- ``local``: a ``manage.py run_worker --automation <slug>`` process on this computer,
  so the whole path of a job runs on one machine (development, demos, tests);
- ``ec2``: an Amazon EC2 instance, started and stopped with boto3.

Powering on is idempotent: a machine already up (or coming up) is left alone. Restarting
stops a machine that runs and starts it again (a worker crashed, hung, or holding a
rotated credential). The hub never calls a provider inside a request; the
``machines.power_on`` and ``machines.restart`` tasks do.
"""

from __future__ import annotations

from automation.machines.base import MachineBusy, MachineProvider, MachineState, PowerOn
from automation.machines.ec2 import Ec2Provider
from automation.machines.local import LocalProvider

PROVIDERS: dict[str, type[MachineProvider]] = {
    "local": LocalProvider,
    "ec2": Ec2Provider,
}


def provider_for(worker) -> MachineProvider:
    try:
        return PROVIDERS[worker.provider]()
    except KeyError:
        raise ValueError(f"unknown machine provider {worker.provider!r}") from None


__all__ = ["PROVIDERS", "MachineBusy", "MachineProvider", "MachineState", "PowerOn", "provider_for"]
