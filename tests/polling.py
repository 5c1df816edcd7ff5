"""The one way the tests wait: poll for a positive signal, within a bound.

A test that sleeps and then asserts that nothing happened passes just as well when the
thing had no time to happen; waiting for something that proves it had its chance (a
counter, a log line, a later message handled) is what makes the assertion mean something.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimedOut(AssertionError, TimeoutError):
    """The condition never held: a failed assertion for pytest, a ``TimeoutError`` for the
    fixtures that clean up after a private service that never came up."""


def wait_until(
    predicate: Callable[[], T],
    *,
    timeout: float = 10.0,
    interval: float = 0.05,
    message: str | Callable[[], str] = "",
) -> T:
    """Call ``predicate`` until it returns something true, and return that.

    Gives up after ``timeout`` seconds with ``WaitTimedOut`` saying ``message`` (or what
    a callable ``message`` returns then: the state worth seeing when it failed).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            what = message() if callable(message) else message
            raise WaitTimedOut(f"gave up after {timeout:g} s waiting for {what or predicate}")
        time.sleep(interval)
