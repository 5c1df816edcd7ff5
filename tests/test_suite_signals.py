"""The suite's processes hand stoppable SIGINT and SIGTERM to what they start
(tests/conftest.py)."""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests.conftest import _hear_stop_signals

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignored_by_a_child(signum: signal.Signals) -> bool:
    """Whether a process started now has ``signum`` ignored (its SigIgn mask, as the kernel
    keeps it)."""
    status = subprocess.run(
        ["sh", "-c", "grep SigIgn /proc/self/status"], capture_output=True, text=True, check=True
    ).stdout
    return bool(int(status.split()[1], 16) & (1 << (signum - 1)))


@pytest.fixture
def signals_as_they_were():
    saved = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda signum: signum.name)
def test_a_suite_started_with_a_stop_signal_ignored_starts_processes_that_hear_it(
    signals_as_they_were, signum
):
    # As a shell without job control starts a command in the background (SIGINT), or a
    # runner that ignores SIGTERM.
    signal.signal(signum, signal.SIG_IGN)
    assert ignored_by_a_child(signum)

    _hear_stop_signals()

    assert not ignored_by_a_child(signum)
    assert signal.getsignal(signum) is not signal.SIG_IGN


def test_a_handler_of_the_suites_own_is_left_alone(signals_as_they_were):
    def own(signum, frame) -> None: ...

    signal.signal(signal.SIGINT, own)
    _hear_stop_signals()
    assert signal.getsignal(signal.SIGINT) is own
    assert not ignored_by_a_child(signal.SIGINT)
