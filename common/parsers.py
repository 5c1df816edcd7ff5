"""The API's request parser (``DEFAULT_PARSER_CLASSES``).

A module of its own: DRF imports it while defining ``APIView``, so it must not import
``rest_framework.views`` (as ``common.api`` does) or the import goes round in a circle.
"""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions, parsers

from common.jsondata import (
    MAX_DEPTH,
    PROBLEM,
    describe_path,
    storable_text,
    unstorable_path,
    within_depth,
)


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing documents nested deeper than ``MAX_DEPTH`` levels
    (``common.jsondata``: DRF would let ``json``'s ``RecursionError`` through as a 500; a
    few kilobytes of ``[`` are enough), and text that PostgreSQL or UTF-8 cannot hold
    (``refuse_unstorable_text``).
    """

    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            data = None
        else:
            if within_depth(data, MAX_DEPTH):
                return refuse_unstorable_text(data, view=(parser_context or {}).get("view"))
        raise exceptions.ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.")


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
