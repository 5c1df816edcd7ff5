#!/usr/bin/env python3
"""A container's health check, for the API and the daemons alike (standard library only).

    healthcheck.py --ready [URL]            # the API: /health/ready answers 200
                                            # (default http://127.0.0.1:$PORT/health/ready;
                                            # HEALTH_HOST: the Host header, if not the URL's)
    healthcheck.py --liveness FILE --max-age SECONDS
                                            # a daemon: its LIVENESS_FILE was written lately
                                            # (what degrades it is printed, still healthy)

Without arguments it picks by the environment: the liveness file when ``LIVENESS_FILE`` is
set (a daemon's), else the API's readiness on ``PORT``. Exit status 0: healthy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request

# Longer than HEALTH_READY_BUDGET (6 s by default): the readiness view answers within it.
READY_TIMEOUT = 10.0
DEFAULT_MAX_AGE = 60.0


def ready(url: str) -> bool:
    if not url.startswith(("http://", "https://")):
        print(f"not an HTTP URL: {url}", file=sys.stderr)
        return False
    # The URL's host must be in ALLOWED_HOSTS; HEALTH_HOST names another one to send.
    headers = {"Host": os.environ["HEALTH_HOST"]} if os.environ.get("HEALTH_HOST") else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (http(s) only)
    try:
        with urllib.request.urlopen(request, timeout=READY_TIMEOUT) as response:  # noqa: S310
            return response.status == 200
    except (urllib.error.URLError, OSError) as exc:
        print(f"not ready: {exc}", file=sys.stderr)
        return False


def alive(path: str, max_age: float) -> bool:
    """Whether the file is recent; what degrades the daemon meanwhile is printed, and is
    no reason to restart it (it sweeps without Redis, it waits out a broker's alarm)."""
    try:
        age = time.time() - os.stat(path).st_mtime
    except OSError as exc:
        print(f"no sign of life: {exc}", file=sys.stderr)
        return False
    if age > max_age:
        print(f"last sign of life {age:.0f} s ago (more than {max_age:.0f} s)", file=sys.stderr)
        return False
    for name, state in degraded(path).items():
        print(f"alive, {name} degraded since {state.get('since')}: {state.get('detail')}")
    return True


def degraded(path: str) -> dict[str, dict[str, str]]:
    """What the daemon's liveness file says degrades it (nothing, if it says nothing)."""
    try:
        with open(path, encoding="utf-8") as file:
            state = json.load(file)
    except (OSError, ValueError):
        return {}
    found = state.get("degraded") if isinstance(state, dict) else None
    return found if isinstance(found, dict) else {}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ready", nargs="?", const="", default=None, metavar="URL")
    parser.add_argument("--liveness", metavar="FILE")
    parser.add_argument("--max-age", type=float, default=None)
    args = parser.parse_args(argv)
    max_age = args.max_age or float(os.environ.get("LIVENESS_MAX_AGE", DEFAULT_MAX_AGE))
    liveness = args.liveness or (
        None if args.ready is not None else os.environ.get("LIVENESS_FILE")
    )
    if liveness:
        return 0 if alive(liveness, max_age) else 1
    url = args.ready or f"http://127.0.0.1:{os.environ.get('PORT', '8000')}/health/ready"
    return 0 if ready(url) else 1


if __name__ == "__main__":
    sys.exit(main())
