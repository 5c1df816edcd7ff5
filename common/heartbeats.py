"""Where the admin reads each daemon's last sign of life.

A daemon's heartbeat gauge lives in its own process (``/metrics`` on its port) and its
liveness file in its own container: neither is visible to the admin's process. So each
beat is also written to the cache (Redis), at most every ``RECORD_EVERY`` seconds, under
the daemon's name. Only a window on the daemons: a Redis outage costs the daemon one
bounded attempt per ``RECORD_EVERY`` and is otherwise ignored (its loop must not care).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import redis
from django.conf import settings
from django.core.cache import cache

from common.accelerator import redis_hold_off

logger = logging.getLogger("hubdommed")

# The daemons the console shows, in the order it shows them.
DAEMONS = ("relay", "worker", "scheduler", "monitor")
# Seconds between two records of one daemon's beat (the console shows ages to the second,
# but nobody needs it fresher than this).
RECORD_EVERY = 5.0
# A record outlives a stopped daemon for a week: "last seen 3 days ago" is worth reading.
KEEP_SECONDS = 7 * 24 * 3600


def _key(daemon: str) -> str:
    return f"heartbeat:{daemon}"


def heartbeat_record(daemon: str, at: float) -> None:
    """Record that ``daemon`` beat at Unix time ``at``; a cache failure is logged, not raised."""
    hold_off = redis_hold_off(settings.CACHES["default"]["LOCATION"])
    if not hold_off.admits():
        return
    try:
        cache.set(_key(daemon), at, timeout=KEEP_SECONDS)
    except (redis.RedisError, OSError) as exc:
        hold_off.failed()
        logger.debug("heartbeat of %s not recorded: %s", daemon, exc)
        return


def heartbeats_last() -> dict[str, datetime | None] | None:
    """Each daemon's last recorded beat (None: never seen); None when the cache cannot be read."""
    try:
        found = cache.get_many([_key(daemon) for daemon in DAEMONS])
    except (redis.RedisError, OSError) as exc:
        logger.warning("daemons' heartbeats unreadable: %s", exc)
        return None
    beats: dict[str, datetime | None] = {}
    for daemon in DAEMONS:
        at = found.get(_key(daemon))
        beats[daemon] = datetime.fromtimestamp(at, tz=UTC) if at is not None else None
    return beats
