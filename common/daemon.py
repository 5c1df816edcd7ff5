"""The project's daemons: the skeleton of ``lifecycle.daemon`` with the project's log context
(``common.context``), which each cycle's correlation id is bound in; that package stands
below this one and cannot name it."""

from __future__ import annotations

from common.context import log_context
from common.errors import transaction_conflict
from common.logs import flush_now
from lifecycle import daemon


class Daemon(daemon.Daemon):
    """``run_relay``, ``run_scheduler`` and ``watch_stuck_jobs`` subclass this one."""

    log_context = staticmethod(log_context)

    def _stuck(self, where: str) -> None:
        super()._stuck(where)
        flush_now()

    def database_away(self, exc: Exception) -> None:
        """A transaction the database aborted for another's sake (a deadlock) is no outage:
        said as what it is, an error of lock order to fix; the next cycle tries again."""
        conflict = transaction_conflict(exc)
        if conflict is None:
            super().database_away(exc)
            return
        self.logger.error(
            "%s: a transaction aborted by a %s (%s); the next cycle tries again",
            self.name,
            conflict.reason,
            exc,
        )
        self.drop_connection()
