"""The walk that finds what a request's JSON cannot be (``common.jsondata.first_flaw``):
the same answers as a plain recursive reading, in memory as deep as the document.

A body at the API's size limit may hold a million elements inside a hundred levels; the
walk once kept every element with its own copy of its path, a gigabyte for one request
before it was refused or taken.
"""

from __future__ import annotations

import io
import json
import math
import tracemalloc

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rest_framework.exceptions import ParseError, ValidationError

from common.jsondata import MAX_DEPTH, first_flaw, unstorable_path
from common.parsers import JSONParser


def _reference(value, depth=1, path=()):
    """The flaws in document order, read recursively (fine for the small documents here)."""
    if isinstance(value, str):
        if "\x00" in value or any("\ud800" <= c <= "\udfff" for c in value):
            yield "unstorable_text", list(path)
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            yield "not_finite", list(path)
        return
    if not isinstance(value, dict | list):
        return
    if depth > MAX_DEPTH:
        yield "too_deep", list(path)
        return
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, child in items:
        if isinstance(key, str) and "\x00" in key:
            yield "unstorable_text", [*path, key]
            return
        yield from _reference(child, depth + 1, (*path, key))


texts = st.sampled_from(["a", "", "\x00", "b\ud800", "ok"])
leaves = st.none() | st.booleans() | st.integers() | st.floats() | texts
documents = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(["k", "\x00", "j"]), children, max_size=3)
    ),
    max_leaves=30,
)


@given(documents)
def test_the_first_flaw_is_the_first_a_recursive_reading_finds(document):
    expected = next(_reference(document), None)
    flaw = first_flaw(document)
    assert (None if flaw is None else (flaw.kind, flaw.path)) == expected


def _nested(depth: int, inner) -> list:
    for _ in range(depth - 1):
        inner = [inner]
    return inner


def test_the_level_past_the_limit_is_named():
    assert first_flaw(_nested(MAX_DEPTH, [])) is None
    flaw = first_flaw(_nested(MAX_DEPTH + 1, []))
    assert flaw.kind == "too_deep"
    assert flaw.path == [0] * MAX_DEPTH


def test_a_flaw_deep_in_a_large_document_is_found_with_its_path():
    document = {"params": _nested(90, [0] * 50_000 + [{"x": "a\x00"}])}
    assert unstorable_path(document) == ["params", *[0] * 89, 50_000, "x"]


def _peak_of(check, document) -> int:
    tracemalloc.start()
    try:
        check(document)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize(
    "check",
    [
        pytest.param(first_flaw, id="first_flaw"),
        pytest.param(unstorable_path, id="unstorable_path"),
    ],
)
def test_a_large_document_is_walked_in_memory_as_deep_as_it_not_as_large(check):
    # 200,000 numbers inside 95 levels: about 1.2 MB of JSON, under the API's body limit.
    # Kept with a copy of its path each, they took some 150 MB; a level's iterator and
    # the path alone take a few kilobytes.
    document = {"params": _nested(95, [0] * 200_000)}
    assert _peak_of(check, document) < 1_000_000


def test_the_parser_refuses_too_deep_and_unstorable_bodies_and_takes_a_large_one():
    parser = JSONParser()

    def parse(document):
        return parser.parse(io.BytesIO(json.dumps(document).encode()), "application/json", {})

    with pytest.raises(ParseError, match="nested more than 100 levels"):
        parse(_nested(MAX_DEPTH + 1, []))
    with pytest.raises(ValidationError) as refused:
        parse({"params": {"a": [1, "x\x00"]}})
    assert refused.value.detail == {
        "params": [
            "Text must not contain U+0000 or a lone surrogate (U+D800 to U+DFFF). "
            "(at 'params/a/1')."
        ]
    }
    large = {"params": _nested(95, [0] * 200_000)}
    assert parse(large) == large
