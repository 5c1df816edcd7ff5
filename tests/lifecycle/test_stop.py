"""The one way every daemon stops, and the one backoff they wait with."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from lifecycle import Backoff, Stop


@pytest.fixture
def restore_signals():
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)


def test_a_wait_ends_as_soon_as_another_thread_asks_for_the_stop():
    stop = Stop()
    threading.Timer(0.2, stop.set).start()
    started = time.monotonic()
    assert stop.wait(30) is True
    assert time.monotonic() - started < 5


def test_a_wait_without_a_stop_lasts_its_timeout_and_says_so():
    stop = Stop()
    assert stop.wait(0.05) is False
    assert not stop.requested


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_set_the_flag_and_run_the_callbacks_once(restore_signals, signum):
    stop = Stop()
    called = []
    stop.on_stop(lambda: called.append("stopped"))
    stop.install()
    os.kill(os.getpid(), signum)
    assert stop.wait(5)
    os.kill(os.getpid(), signum)  # a second signal, with nothing asked for it
    assert called == ["stopped"]


def test_a_second_signal_does_what_twice_says(restore_signals):
    stop = Stop()
    seconds = []
    stop.install(twice=lambda: seconds.append("again"))
    os.kill(os.getpid(), signal.SIGTERM)
    assert stop.wait(5) and seconds == []
    os.kill(os.getpid(), signal.SIGTERM)
    assert seconds == ["again"]


def test_sleep_until_a_deadline_already_past_returns_at_once():
    assert Stop().sleep_until(time.monotonic() - 1) is False


def test_pauses_double_from_the_first_up_to_the_cap_and_reset_after_a_success():
    backoff = Backoff(0.5, 4.0)
    assert backoff.pause == 0.0
    assert [backoff.failed() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert backoff.failures == 6 and backoff.pause == 4.0
    backoff.reset()
    assert backoff.pause == 0.0 and backoff.failed() == 0.5


def test_a_long_outage_never_overflows_the_pause():
    backoff = Backoff(0.5, 2.0)
    backoff.failures = 5000
    assert backoff.failed() == 2.0
