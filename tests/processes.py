"""Daemons started as subprocesses (``manage.py run_relay`` …), pointed at what this run uses."""

from __future__ import annotations

import os


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
