"""A stop asked for while a daemon is still starting.

Between ``manage.py`` starting and a daemon's ``handle`` installing its own handlers lie
Django's set-up (every app imported) and the daemon's own module: a second or more on a
busy machine. A SIGTERM then (an orchestrator scaling down, a deploy that changed its
mind) must still be a clean exit 0, not a death by signal that alerts someone. So
``manage.py`` calls ``catch_stop_during_startup`` before it imports Django; the flag it
installs only records the stop, and the daemon, once its handlers take over, stops at
once when it finds it set (``lifecycle.daemon``, ``run_worker``).

Other commands (``migrate``, ``shell``) keep the default: a SIGTERM ends them there and then.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext

from lifecycle import Stop

# The commands that run until told to stop. A new daemon adds its name here.
DAEMONS = frozenset({"run_relay", "run_scheduler", "run_worker", "watch_stuck_jobs"})

_during_startup = Stop()
_daemon_process = False


def catch_stop_during_startup(argv: Sequence[str]) -> None:
    """When ``argv`` starts a daemon, let SIGTERM and SIGINT only record the stop from now
    until the daemon installs its own handlers."""
    global _daemon_process
    if len(argv) > 1 and argv[1] in DAEMONS:
        _daemon_process = True
        _during_startup.install()


def daemon_process() -> bool:
    """Whether this process is a daemon that ``manage.py`` started: only then may its stop
    end the process where it is blocked (``Stop.bounded``), never a test's that runs a
    daemon's command in its own process."""
    return _daemon_process


def stopped_during_startup() -> bool:
    """True when a stop was asked for before the daemon's own handlers were in place."""
    return _during_startup.requested


def bounded_stop(
    stop: Stop, seconds: float, say: Callable[[str], None]
) -> AbstractContextManager[None]:
    """``stop.bounded(seconds, say)`` in a daemon ``manage.py`` started; nothing elsewhere."""
    return stop.bounded(seconds, say) if daemon_process() else nullcontext()
