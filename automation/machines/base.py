from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from enum import StrEnum


class MachineState(StrEnum):
    RUNNING = "running"  # up, or coming up
    STOPPED = "stopped"
    STOPPING = "stopping"
    UNKNOWN = "unknown"


class PowerOn(StrEnum):
    STARTED = "started"  # this call started it
    ALREADY_RUNNING = "already_running"  # nothing to do


class MachineBusy(RuntimeError):
    """The machine did not stop in time to be restarted: try again later."""


class MachineProvider(ABC):
    name: str

    @abstractmethod
    def power_on(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        """Start the worker's machine unless it is up already (idempotent).

        ``issue_credential`` gives a fresh worker credential to a machine the hub
        provisions itself (``local``), called only once the provider is sure to start
        it (a rotation makes the previous credential stop working). A cloud machine
        keeps the one it was provisioned with.
        """

    @abstractmethod
    def restart(self, worker, *, issue_credential: Callable[[], str] | None = None) -> PowerOn:
        """Stop the worker's machine if it runs, then start it again: its worker crashed,
        hung, or holds a credential that was rotated. ``issue_credential`` as for
        ``power_on``. Raises ``MachineBusy`` when the machine would not stop in time (the
        caller tries again later)."""

    @abstractmethod
    def power_off(self, worker) -> None:
        """Stop the machine (idempotent)."""

    @abstractmethod
    def state(self, worker) -> MachineState:
        """What the provider says the machine is doing now."""

    def needs_credential(self) -> bool:
        """Whether ``power_on`` must be given a fresh credential to start a machine."""
        return False
