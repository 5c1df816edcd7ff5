"""The lock a local machine's worker holds while it lives, let go when idle and taken back
when a job comes after all: one worker per machine whatever the order of events."""

from __future__ import annotations

import fcntl
import os

import pytest

from automation.machines.local import LOCK_FD_ENV
from worker.management.commands.run_worker import MachineLock


@pytest.fixture
def machine(settings, tmp_path, monkeypatch):
    """A lock file as the local provider leaves it: held through a descriptor handed over
    in the environment."""
    settings.LOCAL_MACHINES_DIR = str(tmp_path)
    path = tmp_path / "nightly.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    monkeypatch.setenv(LOCK_FD_ENV, str(fd))
    return path


def held_by_someone(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_the_lock_let_go_is_taken_back_when_nobody_took_it(machine):
    lock = MachineLock("nightly")
    lock.release()
    assert not held_by_someone(machine)

    assert lock.reclaim()

    assert held_by_someone(machine)
    lock.release()
    assert not held_by_someone(machine)


def test_the_lock_another_worker_took_is_not_taken_back(machine):
    lock = MachineLock("nightly")
    lock.release()
    # A power-on took it meanwhile (for the worker it starts).
    other = os.open(machine, os.O_RDWR)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        assert not lock.reclaim()
    finally:
        os.close(other)


def test_a_worker_started_without_a_lock_has_nothing_to_take_back(settings, tmp_path):
    # An EC2 machine's worker, or one started by hand: no local lock to contend for.
    settings.LOCAL_MACHINES_DIR = str(tmp_path)
    lock = MachineLock("nightly")
    lock.release()

    assert lock.reclaim()
    assert not list(tmp_path.iterdir())
