"""Text that PostgreSQL or UTF-8 cannot hold, and documents nested too deep, found anywhere
in a request's data.

PostgreSQL refuses U+0000 in ``text`` and ``jsonb``, and a lone surrogate (U+D800 to
U+DFFF, which JSON can spell as ``"\\ud800"``) cannot even be encoded as UTF-8: either
would fail only at the INSERT or when the answer is rendered, as a 500. Requests are
checked once, where they are parsed (``common.parsers``, ``common.middleware``).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

NUL = "\x00"
REPLACEMENT = "\ufffd"
# NUL, and any surrogate code point: JSON decoding joins a valid pair into one character,
# so a surrogate left in a Python string is a lone one.
_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")

PROBLEM = "Text must not contain U+0000 or a lone surrogate (U+D800 to U+DFFF)."

# Levels of nesting a JSON document of a request may have. ``json`` raises
# ``RecursionError`` (not a ``ValueError``) for a document nested deeper than Python's stack
# allows, and one a little less deep parses, then fails the same way wherever it is encoded
# again. No input of the hub needs more than a few levels: a generous cap refuses both.
MAX_DEPTH = 100
TOO_DEEP = f"JSON nested more than {MAX_DEPTH} levels deep."


def within_depth(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``value`` nests at most ``limit`` levels of objects and arrays."""
    # Iterative: the point is not to recurse on what the client nested.
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if isinstance(current, dict):
            children = current.values()
        elif isinstance(current, list):
            children = current
        else:
            continue
        if depth > limit:
            return False
        stack.extend((child, depth + 1) for child in children)
    return True


NOT_FINITE = "Numbers must be finite: JSON has no NaN or Infinity."


def all_finite(value: Any) -> bool:
    """Whether every number in ``value`` is finite (Python's JSON reader takes ``NaN``,
    ``Infinity`` and ``1e999``; PostgreSQL's jsonb refuses them). Iterative, as the others."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, float) and not math.isfinite(current):
            return False
        if isinstance(current, dict):
            stack.extend(current.values())
        elif isinstance(current, list | tuple):
            stack.extend(current)
    return True


def unstorable_path(value: Any) -> list[str | int] | None:
    """Where, in ``value``, the first string or key holding unstorable text is; else None.

    The path is the keys and indexes leading to it (empty when ``value`` itself is the
    string). Iterative: the point is not to recurse on what a client nested.
    """
    stack: list[tuple[Any, list[str | int]]] = [(value, [])]
    while stack:
        current, path = stack.pop()
        if isinstance(current, str):
            if _UNSTORABLE.search(current):
                return path
        elif isinstance(current, dict):
            for key, child in current.items():
                if isinstance(key, str) and _UNSTORABLE.search(key):
                    return [*path, key]
                stack.append((child, [*path, key]))
        elif isinstance(current, list | tuple):
            stack.extend((child, [*path, index]) for index, child in enumerate(current))
    return None


def describe_path(path: list[str | int]) -> str:
    """``path`` as printable ASCII (``params/a/0``): it may itself hold the bad text."""
    return "/".join(
        json.dumps(part, ensure_ascii=True)[1:-1] if isinstance(part, str) else str(part)
        for part in path
    )


def storable_text(text: str) -> str:
    """``text`` with every unstorable character replaced by U+FFFD."""
    return _UNSTORABLE.sub(REPLACEMENT, text)
