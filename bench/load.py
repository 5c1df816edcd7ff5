"""The machine's load: a figure taken above ``LIMIT`` does not count.

The machine is shared. A benchmark calls :func:`require_quiet` before it measures: it waits a
while for the one-minute load average to fall to the limit and refuses to run when it does
not (``--allow-load`` runs anyway, and every round's :func:`load_note` then says the figure
does not count). Each round prints the load at its start, so a reader can tell a quiet round
from one measured beside a test suite, and a median over rounds is taken over the rounds
that count (:class:`Rounds`), its line saying how many.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

LIMIT = 2.0
WAIT_SECONDS = 180.0

T = TypeVar("T")


def load_note(load: Callable[[], float] = lambda: os.getloadavg()[0]) -> str:
    """``load 0.44`` (the one-minute load average), flagged when it is above the limit."""
    return _note(load())


def _note(one_minute: float) -> str:
    flag = f" (above {LIMIT:g}: this round does not count)" if one_minute > LIMIT else ""
    return f"load {one_minute:.2f}{flag}"


class Rounds:
    """A benchmark's rounds and which of them count: those whose load average was within
    the limit when they began. A summary over rounds (a median) is taken over the rounds
    that count, and says how many; when none does, over all of them, and says that the
    figures do not count."""

    def __init__(self, load: Callable[[], float] = lambda: os.getloadavg()[0]) -> None:
        self._load = load
        self.counted: list[bool] = []

    def start(self) -> str:
        """A round begins: its load, noted (``load_note``'s words)."""
        one_minute = self._load()
        self.counted.append(one_minute <= LIMIT)
        return _note(one_minute)

    def kept(self, values: Sequence[T]) -> list[T]:
        """Of ``values`` (one for each round begun, in order), those of the rounds that
        count; all of them when none does."""
        if len(values) != len(self.counted):
            raise ValueError(f"{len(values)} figures for {len(self.counted)} rounds")
        kept = [value for value, counts in zip(values, self.counted, strict=True) if counts]
        return kept or list(values)

    def note(self) -> str:
        """How many rounds a summary is over: ``3 rounds``, ``2 of 3 rounds (...)``."""
        counted, begun = sum(self.counted), len(self.counted)
        rounds = "round" if begun == 1 else "rounds"
        if counted == begun:
            return f"{begun} {rounds}"
        if counted == 0:
            return f"{begun} {rounds}, none of which counts (begun above load {LIMIT:g})"
        return f"{counted} of {begun} rounds (the others began above load {LIMIT:g})"


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
