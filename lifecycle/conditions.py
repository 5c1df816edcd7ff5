"""What holds this process back without stopping it: a degraded accelerator, a broker that
blocks publishing.

Neither is a failure. Without Redis the daemons sweep instead of waking on a signal; a
broker's memory or disk alarm holds the relay's publishing until it clears. A health check
that restarted a daemon over either would cost a start-up and help nothing, so the
liveness file stays fresh, and says what is degraded and since when
(``common.metrics.Heartbeat`` writes it, ``scripts/healthcheck.py`` prints it).

Each condition has a name (``"redis"``, ``"rabbitmq"``) and a sentence; whoever finds it
sets it, and clears it when it is over.
"""

from __future__ import annotations

import os
import threading
from datetime import UTC, datetime

_lock = threading.Lock()
_conditions: dict[str, dict[str, str]] = {}


def degraded(name: str, detail: str, *, replace: bool = True) -> None:
    """``name`` is degraded from now (since its first report, while it lasts).

    ``replace=False``: a general sentence that does not replace what a more particular
    caller said (Redis held off, under the relay's "sweeping every 2 s").
    """
    with _lock:
        current = _conditions.get(name)
        if current is not None and not replace:
            return
        since = current["since"] if current else datetime.now(UTC).isoformat(timespec="seconds")
        _conditions[name] = {"detail": detail, "since": since}


def recovered(name: str) -> None:
    with _lock:
        _conditions.pop(name, None)


def current() -> dict[str, dict[str, str]]:
    """Every condition in force: name -> {detail, since}."""
    with _lock:
        return {name: dict(state) for name, state in _conditions.items()}


def clear() -> None:
    """Forget every condition (tests)."""
    with _lock:
        _conditions.clear()


# A forked child (gunicorn's workers) finds out for itself, as with Redis's hold-offs.
os.register_at_fork(after_in_child=_conditions.clear)
