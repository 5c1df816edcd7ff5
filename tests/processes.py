"""Daemons started as subprocesses (``manage.py run_relay`` …), pointed at what this run uses."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from tests.polling import wait_until


def process_environment(settings, **extra: str) -> dict[str, str]:
    """The environment of a ``manage.py`` subprocess that shares this run's resources.

    The database is the one the settings name now (under pytest, the test database, where
    the test's committed rows are); queue names, the exchange and Redis keys are this run's
    own, so parallel runs never meet. ``extra`` adds or overrides variables.
    """
    db = settings.DATABASES["default"]
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "QUEUE_PREFIX": settings.QUEUE_PREFIX,
        "RABBITMQ_EXCHANGE": settings.RABBITMQ_EXCHANGE,
        "REDIS_KEY_PREFIX": settings.REDIS_KEY_PREFIX,
        **extra,
    }


def handles(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler of its own for ``signum`` (the kernel's
    caught-signals mask, ``SigCgt``); False once it has gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    return False


def wait_until_it_handles(
    process: subprocess.Popen, signum: int = signal.SIGTERM, timeout: float = 30
) -> None:
    """Until the daemon has installed its handler for ``signum`` (or has exited).

    A daemon signalled before that dies by the signal (exit -15) instead of stopping the
    way the test means to check: a test signals a daemon only once it is ready for it.
    """
    wait_until(
        lambda: process.poll() is not None or handles(process.pid, signum),
        timeout=timeout,
        message=f"process {process.pid} to handle signal {signum}",
    )


def database_sessions(application_name: str) -> int:
    """How many sessions of the test database a process started with ``PGAPPNAME`` (its
    ``application_name``) still has open: told apart from any other test's."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]
