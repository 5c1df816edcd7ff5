"""The machine's load at a round's start: a figure taken above ``LIMIT`` does not count.

The machine is shared; each benchmark prints this beside every round so a reader can tell
a quiet round from one measured beside a test suite.
"""

import os

LIMIT = 2.0


def load_note() -> str:
    """``load 0.44`` (the one-minute load average), flagged when it is above the limit."""
    one_minute = os.getloadavg()[0]
    flag = f" (above {LIMIT:g}: this round does not count)" if one_minute > LIMIT else ""
    return f"load {one_minute:.2f}{flag}"
