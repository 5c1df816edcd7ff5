"""Numbers an operator gives a process, in its environment or on its command line.

One reading for both: a plain decimal number, no unit, within the bounds the value
allows. ``5s``, ``5m``, ``1e3s``, ``0x10`` or ``nan`` are refused with a message that says
what is accepted, never read as something else (``5m`` as 5 seconds, say). Without a
bound of its own a number is at most ``LARGEST``: past it, a wait overflows the clock's
range and a date leaves the calendar, deep inside a daemon long after its start.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable

# About 31 years, in seconds; far above any sensible count, size or duration.
LARGEST = 10**9

_WHOLE = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def accepted(*, whole: bool, minimum: float | None, maximum: float | None) -> str:
    """What a value may be, in words: ``a whole number from 1 to 1000``."""
    kind = "a whole number" if whole else "a plain number (no unit)"
    top = _shown(LARGEST if maximum is None else maximum)
    if minimum is None:
        return f"{kind} up to {top}"
    return f"{kind} from {_shown(minimum)} to {top}"


def _shown(bound: float) -> str:
    """A bound as an operator would type it: 2147483, 0.05 (never 2.14748e+06)."""
    return str(int(bound)) if float(bound).is_integer() else repr(float(bound))


def parse_number(
    text: str, *, whole: bool, minimum: float | None = None, maximum: float | None = None
) -> int | float:
    """``text`` as an int (``whole``) or a float within the bounds, else ``ValueError`` whose
    message says what is accepted."""
    raw = text.strip()
    top = LARGEST if maximum is None else maximum
    if whole and _WHOLE.fullmatch(raw):
        value: int | float = int(raw)
    elif not whole and _DECIMAL.fullmatch(raw):
        value = float(raw)
    else:
        value = math.nan
    if not math.isfinite(value) or (minimum is not None and value < minimum) or value > top:
        raise ValueError(accepted(whole=whole, minimum=minimum, maximum=maximum))
    return value


def number_option(
    *, whole: bool = False, minimum: float | None = None, maximum: float | None = None
) -> Callable[[str], int | float]:
    """An argparse ``type`` for a command's numeric option: a bad value is the parser's
    usage error (``argument --interval: ...``), exit 2, before anything starts."""

    def parse(text: str) -> int | float:
        try:
            return parse_number(text, whole=whole, minimum=minimum, maximum=maximum)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"{text!r} is not {exc}") from None

    return parse
