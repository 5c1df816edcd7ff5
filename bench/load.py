"""The machine's load: a figure taken above ``LIMIT`` does not count.

The machine is shared. A benchmark calls :func:`require_quiet` before it measures: it waits a
while for the one-minute load average to fall to the limit and refuses to run when it does
not (``--allow-load`` runs anyway, and every round's :func:`load_note` then says the figure
does not count). Each round prints the load at its start, so a reader can tell a quiet round
from one measured beside a test suite.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

LIMIT = 2.0
WAIT_SECONDS = 180.0


def load_note(load: Callable[[], float] = lambda: os.getloadavg()[0]) -> str:
    """``load 0.44`` (the one-minute load average), flagged when it is above the limit."""
    one_minute = load()
    flag = f" (above {LIMIT:g}: this round does not count)" if one_minute > LIMIT else ""
    return f"load {one_minute:.2f}{flag}"


def add_load_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-load",
        action="store_true",
        help=f"measure even when the load average stays above {LIMIT:g} (each round says so)",
    )
    parser.add_argument(
        "--load-wait",
        type=float,
        default=WAIT_SECONDS,
        help="seconds to wait for the load average to fall to the limit before refusing",
    )


def require_quiet(
    args: argparse.Namespace,
    *,
    load: Callable[[], float] = lambda: os.getloadavg()[0],
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Return once the machine is quiet enough to measure; exit 2 if it does not get there.

    ``args`` carries ``allow_load`` and ``load_wait`` (:func:`add_load_arguments`).
    """
    waited = 0.0
    while (current := load()) > LIMIT and waited < args.load_wait:
        if waited == 0:
            print(f"load {current:.2f} is above {LIMIT:g}: waiting", flush=True)
        sleep(5.0)
        waited += 5.0
    if current <= LIMIT:
        print(f"load {current:.2f} at the start", flush=True)
        return
    if args.allow_load:
        print(f"load {current:.2f}: measured anyway (--allow-load); these figures do not count")
        return
    sys.exit(
        f"load {current:.2f} is still above {LIMIT:g} after {waited:g} s: refusing to measure "
        "(something else is running; --allow-load measures anyway, flagged)"
    )
