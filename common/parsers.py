"""The API's request parser (``DEFAULT_PARSER_CLASSES``).

A module of its own: DRF imports it while defining ``APIView``, so it must not import
``rest_framework.views`` (as ``common.api`` does) or the import goes round in a circle.
"""

from __future__ import annotations

import codecs
from typing import Any

from django.conf import settings
from django.utils.http import parse_header_parameters
from rest_framework import exceptions, parsers
from rest_framework.utils import json

from common.charsets import is_text_encoding
from common.jsondata import MAX_DEPTH, PROBLEM, describe_path, first_flaw, storable_text


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, refusing documents nested deeper than ``MAX_DEPTH`` levels
    (``common.jsondata``: DRF would let ``json``'s ``RecursionError`` through as a 500; a
    few kilobytes of ``[`` are enough), and text that PostgreSQL or UTF-8 cannot hold
    (``refuse_unstorable_text``), both in one walk of the document; and an object that
    names a key twice (``{"x": 1, "x": 2}``), which ``json`` would read as its last value
    without a word, losing the first. A charset that is no text encoding is a 415
    (``_charset``).
    """

    def parse(self, stream, media_type=None, parser_context=None):
        parser_context = parser_context or {}
        try:
            text = codecs.getreader(_charset(media_type))(stream).read()
            data = json.loads(
                text,
                parse_constant=json.strict_constant if self.strict else None,
                object_pairs_hook=_one_value_a_key,
            )
        except RecursionError:
            raise _too_deep() from None
        except ValueError as exc:  # UnicodeDecodeError included
            raise exceptions.ParseError(f"JSON parse error - {exc}") from None
        return refuse_unstorable_text(data, view=parser_context.get("view"), limit=MAX_DEPTH)


def _charset(media_type: str | None) -> str:
    """The charset the body's ``Content-Type`` names, UTF-8 when it names none; a 415 when
    it is not a text encoding (``charset=bogus``, ``charset=zlib``): the body would be read
    in another than the client's, or expanded by a codec of bytes to bytes."""
    _, params = parse_header_parameters(media_type or "")
    charset = params.get("charset") or settings.DEFAULT_CHARSET
    if not is_text_encoding(charset):
        raise exceptions.UnsupportedMediaType(
            media_type, detail=f'The charset "{charset[:100]}" is not supported: send UTF-8.'
        )
    return charset


def _one_value_a_key(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) < len(pairs):
        seen: set[str] = set()
        twice = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise ValueError(f"the key '{describe_path([twice])}' is given more than once")
    return data


def _too_deep() -> exceptions.ParseError:
    return exceptions.ParseError(f"JSON parse error - nested more than {MAX_DEPTH} levels deep.")


def refuse_unstorable_text(data: Any, *, view: Any = None, limit: int | None = None) -> Any:
    """``data``, or a 400 ``invalid`` naming where a string or key holds U+0000 or a lone
    surrogate: every body is checked here, before any serializer, service or INSERT.

    A view may name top-level text fields (``replace_unstorable_text``) whose unstorable
    characters are replaced by U+FFFD instead: a command's output may hold any byte, and
    refusing it would lose the report it came with.

    With a ``limit``, a document nested deeper than that many levels is a parse error.
    """
    lossy = getattr(view, "replace_unstorable_text", ())
    if lossy and isinstance(data, dict):
        for field in lossy:
            if isinstance(data.get(field), str):
                data[field] = storable_text(data[field])
    flaw = first_flaw(data, limit=limit, finite=False)
    if flaw is None:
        return data
    if flaw.kind == "too_deep":
        raise _too_deep()
    path = flaw.path
    field = path[0] if path and isinstance(path[0], str) else "non_field_errors"
    where = describe_path(path)
    raise exceptions.ValidationError(
        {describe_path([field]): [f"{PROBLEM} (at '{where}')." if where else f"{PROBLEM}"]}
    )
