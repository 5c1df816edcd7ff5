"""The API's request parser (``DEFAULT_PARSER_CLASSES``).

A module of its own: DRF imports it while defining ``APIView``, so it must not import
``rest_framework.views`` (as ``common.api`` does) or the import goes round in a circle.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, parsers

from common.jsondata import PROBLEM, describe_path, storable_text, unstorable_path


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing documents nested deeper than ``MAX_DEPTH`` levels, and
    text that PostgreSQL or UTF-8 cannot hold (``refuse_unstorable_text``).

    ``json`` raises ``RecursionError`` (not a ``ValueError``) for a document nested
    deeper than Python's stack allows, which DRF lets through as a 500; a few kilobytes
    of ``[`` are enough. One nested a little less deep parses, then fails the same way
    wherever it is encoded again (the size check, the database, the outbox). No request
    of this API needs more than a few levels, so a generous cap refuses both at the door.
    """

    MAX_DEPTH = 100

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
        else:
            if _depth_within(data, self.MAX_DEPTH):
                return refuse_unstorable_text(data, view=(parser_context or {}).get("view"))
        raise exceptions.ParseError(
            f"JSON parse error - nested more than {self.MAX_DEPTH} levels deep."
        )


def refuse_unstorable_text(data: Any, *, view: Any = None) -> Any:
    """``data``, or a 400 ``invalid`` naming where a string or key holds U+0000 or a lone
    surrogate: every body is checked here, before any serializer, service or INSERT.

    A view may name top-level text fields (``replace_unstorable_text``) whose unstorable
    characters are replaced by U+FFFD instead: a command's output may hold any byte, and
    refusing it would lose the report it came with.
    """
    lossy = getattr(view, "replace_unstorable_text", ())
    if lossy and isinstance(data, dict):
        for field in lossy:
            if isinstance(data.get(field), str):
                data[field] = storable_text(data[field])
    path = unstorable_path(data)
    if path is None:
        return data
    field = path[0] if path and isinstance(path[0], str) else "non_field_errors"
    where = describe_path(path)
    raise exceptions.ValidationError(
        {describe_path([field]): [f"{PROBLEM} (at '{where}')." if where else f"{PROBLEM}"]}
    )


def _depth_within(value: Any, limit: int) -> bool:
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
