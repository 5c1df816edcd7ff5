"""The suite's processes hand a stoppable SIGINT to what they start (tests/conftest.py)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.conftest import _hear_ctrl_c

SIGINT_BIT = 1 << (signal.SIGINT - 1)


def ignored_by_a_child() -> bool:
    """Whether a process started now has SIGINT ignored (its SigIgn mask, as the kernel
    keeps it)."""
    status = subprocess.run(
        ["sh", "-c", "grep SigIgn /proc/self/status"], capture_output=True, text=True, check=True
    ).stdout
    return bool(int(status.split()[1], 16) & SIGINT_BIT)


@pytest.fixture
def sigint_as_it_was():
    saved = signal.getsignal(signal.SIGINT)
    yield
    signal.signal(signal.SIGINT, saved)


def test_a_suite_started_with_sigint_ignored_starts_processes_that_hear_it(sigint_as_it_was):
    # As a shell without job control starts a command in the background.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    assert ignored_by_a_child()

    _hear_ctrl_c()

    assert not ignored_by_a_child()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_handler_of_the_suites_own_is_left_alone(sigint_as_it_was):
    def own(signum, frame) -> None: ...

    signal.signal(signal.SIGINT, own)
    _hear_ctrl_c()
    assert signal.getsignal(signal.SIGINT) is own
    assert not ignored_by_a_child()
