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
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

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


# Python's JSON reader takes ``NaN``, ``Infinity`` and ``1e999``; PostgreSQL's jsonb refuses
# them.
NOT_FINITE = "Numbers must be finite: JSON has no NaN or Infinity."


def unstorable_path(value: Any) -> list[str | int] | None:
    """Where, in ``value``, the first string or key holding unstorable text is; else None.

    The path is the keys and indexes leading to it (empty when ``value`` itself is the
    string).
    """
    flaw = first_flaw(value, limit=None, finite=False)
    return None if flaw is None else flaw.path


@dataclass(frozen=True)
class Flaw:
    """What ``first_flaw`` found, and the keys and indexes leading to it."""

    kind: Literal["too_deep", "unstorable_text", "not_finite"]
    path: list[str | int]


def first_flaw(
    value: Any, *, limit: int | None = MAX_DEPTH, text: bool = True, finite: bool = True
) -> Flaw | None:
    """The first of these problems in ``value``, in one walk: objects and arrays nested
    more than ``limit`` levels (None: any depth), a string or key holding unstorable text
    (``text``), a number that is not finite (``finite``).

    Iterative, and in memory as deep as the document, not as large: the walk keeps one
    iterator a level and the path to where it is, and copies that path only for the
    flaw it returns. (A stack of every child with its own copy of its path held a
    megabyte-sized body's million elements, each with a path a hundred levels long:
    seconds and a gigabyte for one request, before anything refused it.)
    """
    flaw = _leaf_flaw(value, text=text, finite=finite)
    if flaw is not None:
        return Flaw(flaw, [])
    if not isinstance(value, _CONTAINERS):
        return None
    if limit is not None and limit < 1:
        return Flaw("too_deep", [])
    path: list[str | int] = []
    levels: list[Iterator[tuple[str | int, Any]]] = [_children(value)]
    while levels:
        for key, child in levels[-1]:
            if text and isinstance(key, str) and _UNSTORABLE.search(key):
                return Flaw("unstorable_text", [*path, key])
            flaw = _leaf_flaw(child, text=text, finite=finite)
            if flaw is not None:
                return Flaw(flaw, [*path, key])
            if isinstance(child, _CONTAINERS):
                if limit is not None and len(levels) >= limit:
                    return Flaw("too_deep", [*path, key])
                path.append(key)
                levels.append(_children(child))
                break
        else:
            levels.pop()
            if path:
                path.pop()
    return None


_CONTAINERS = (dict, list, tuple)


def _children(container: Any) -> Iterator[tuple[str | int, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _leaf_flaw(
    value: Any, *, text: bool, finite: bool
) -> Literal["unstorable_text", "not_finite"] | None:
    if text and isinstance(value, str):
        return "unstorable_text" if _UNSTORABLE.search(value) else None
    if finite and isinstance(value, float) and not math.isfinite(value):
        return "not_finite"
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
