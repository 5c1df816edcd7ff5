"""The project's daemons: the skeleton of ``lifecycle.daemon`` with the project's log context
(``common.context``), which each cycle's correlation id is bound in; that package stands
below this one and cannot name it."""

from __future__ import annotations

from common.context import log_context
from lifecycle import daemon


class Daemon(daemon.Daemon):
    """``run_relay``, ``run_scheduler`` and ``watch_stuck_jobs`` subclass this one."""

    log_context = staticmethod(log_context)
