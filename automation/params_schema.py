"""An automation's parameter schema, and the jobs' parameters checked against it.

One validator for an automation's parameter schema: ``params_schema_problem`` when the
automation is saved (API and admin), ``params_errors`` when a job is created, which runs
the same checks first so that a schema stored before them is refused the same way.

A schema is refused when it is recursive (a $ref, $dynamicRef or anchor leading back to
where it started: jsonschema then recurses until RecursionError), unresolvable, or too
big. Regular expressions (pattern, patternProperties, and additionalProperties, which
consults them) are matched with the ``regex`` module under a timeout: whether a pattern
backtracks catastrophically depends on the input, and no syntactic rule (nested
quantifiers, overlapping alternatives...) catches every such pattern, whereas a time
bound holds for all of them. Everything else jsonschema does for one job is bounded by
a deadline checked at every keyword.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import time
from typing import Any

import regex
from django.conf import settings
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

SCHEMA_MAX_BYTES = 64 * 1024
SCHEMA_MAX_SUBSCHEMAS = 1000
SCHEMA_MAX_DEPTH = 40
PATTERN_MAX_LENGTH = 1000
# Keywords whose values are data, not subschemas: a "$ref" in there refers to nothing.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


class UnusableSchema(Exception):
    """The stored schema cannot check parameters (refused by the save-time checks, or it
    took more than the budget on these parameters)."""


def params_schema_problem(schema: Any) -> str | None:
    """Why ``schema`` cannot be an automation's parameter schema, or None when it can."""
    if schema is None:
        return None
    # Job parameters are a JSON object, so their schema is an object schema document.
    if not isinstance(schema, dict):
        return "Must be a JSON Schema object (or null to accept any parameters)."
    size = len(json.dumps(schema, separators=(",", ":"), ensure_ascii=False).encode())
    if size > SCHEMA_MAX_BYTES:
        return f"At most {SCHEMA_MAX_BYTES} bytes of JSON (this one takes {size})."
    nodes, problem = _schema_nodes(schema)
    if problem:
        return problem
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"Not a valid JSON Schema (draft 2020-12): {exc.message}" + (
            f" at '{where}'." if where else "."
        )
    problem = _pattern_problem(nodes)
    if problem:
        return problem
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    edges, ref = _reference_edges(nodes, resolver)
    if ref is not None:
        return (
            f"The reference {ref!r} leads nowhere in this schema: references must point "
            "inside it (the hub never fetches schemas from elsewhere)."
        )
    if _has_cycle(nodes, edges):
        return (
            "The schema is recursive (a $ref, $dynamicRef or anchor leads back into "
            "itself): parameters are checked by schemas that end."
        )
    return None


def _schema_nodes(schema: dict[str, Any]) -> tuple[list[dict[str, Any]], str | None]:
    """Every subschema (object) of ``schema``, parents first; or why there are too many."""
    nodes: list[dict[str, Any]] = []
    stack: list[tuple[Any, int]] = [(schema, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > SCHEMA_MAX_DEPTH:
            return nodes, f"Nested more than {SCHEMA_MAX_DEPTH} levels deep."
        if isinstance(node, dict):
            nodes.append(node)
            if len(nodes) > SCHEMA_MAX_SUBSCHEMAS:
                return nodes, f"More than {SCHEMA_MAX_SUBSCHEMAS} subschemas."
            stack.extend(
                (child, depth + 1) for key, child in node.items() if key not in _DATA_KEYWORDS
            )
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node)
    return nodes, None


def _patterns(nodes: list[dict[str, Any]]):
    for node in nodes:
        if isinstance(node.get("pattern"), str):
            yield node["pattern"]
        if isinstance(node.get("patternProperties"), dict):
            yield from node["patternProperties"]


def _pattern_problem(nodes: list[dict[str, Any]]) -> str | None:
    for pattern in _patterns(nodes):
        if len(pattern) > PATTERN_MAX_LENGTH:
            return f"A pattern is longer than {PATTERN_MAX_LENGTH} characters."
        try:
            regex.compile(pattern)
        except regex.error as exc:
            return f"The pattern {pattern[:80]!r} is not a valid regular expression: {exc}."
    # unevaluatedProperties consults patternProperties through jsonschema's own ``re``,
    # out of reach of the timeout: the two together are refused.
    uses = {key for node in nodes for key in node}
    if {"unevaluatedProperties", "patternProperties"} <= uses:
        return "unevaluatedProperties cannot be combined with patternProperties here."
    return None


def _reference_edges(nodes, resolver) -> tuple[dict[int, list[int]], str | None]:
    """Where each subschema leads: its children, and the targets of its references.

    A ``$dynamicRef`` may land on any ``$dynamicAnchor`` of its name at validation time:
    it leads to all of them, so a loop through any is found.
    """
    dynamic_anchors: dict[str, list[int]] = {}
    for node in nodes:
        if isinstance(node.get("$dynamicAnchor"), str):
            dynamic_anchors.setdefault(node["$dynamicAnchor"], []).append(id(node))
    known = {id(node) for node in nodes}
    edges: dict[int, list[int]] = {}
    for node in nodes:
        targets = [id(child) for child in _children(node)]
        for keyword in ("$ref", "$dynamicRef"):
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                target = resolver.lookup(ref).contents
            except Unresolvable:
                return edges, ref
            if id(target) in known:
                targets.append(id(target))
            if keyword == "$dynamicRef" and ref.startswith("#"):
                targets.extend(dynamic_anchors.get(ref[1:], []))
        edges[id(node)] = targets
    return edges, None


def _children(node: dict[str, Any]):
    stack = [child for key, child in node.items() if key not in _DATA_KEYWORDS]
    while stack:
        child = stack.pop()
        if isinstance(child, dict):
            yield child
        elif isinstance(child, list):
            stack.extend(child)


def _has_cycle(nodes, edges: dict[int, list[int]]) -> bool:
    # Iterative depth-first search, three colours: a grey node met again closes a loop.
    white, grey, black = 0, 1, 2
    colour = {id(node): white for node in nodes}
    for start in colour:
        if colour[start] != white:
            continue
        colour[start] = grey
        stack = [(start, iter(edges.get(start, ())))]
        while stack:
            current, pending = stack[-1]
            following = next(pending, None)
            if following is None:
                colour[current] = black
                stack.pop()
            elif colour.get(following) == grey:
                return True
            elif colour.get(following) == white:
                colour[following] = grey
                stack.append((following, iter(edges.get(following, ()))))
    return False


def params_errors(params: dict[str, Any], schema: dict[str, Any] | None) -> list[str]:
    """What is wrong with ``params`` for ``schema`` (at most 20 messages); empty when valid.

    Raises ``UnusableSchema`` when the schema fails the save-time checks or when checking
    takes longer than ``JOB_PARAMS_VALIDATION_SECONDS``.
    """
    if schema is None:
        return []
    problem = _stored_schema_problem(json.dumps(schema, sort_keys=True))
    if problem:
        raise UnusableSchema(problem)
    # An empty registry: a $ref is resolved inside the schema or not at all, never
    # fetched over the network in the middle of a request.
    validator = _BoundedValidator(schema, registry=Registry())
    token = _deadline.set(time.monotonic() + settings.JOB_PARAMS_VALIDATION_SECONDS)
    try:
        errors = list(itertools.islice(validator.iter_errors(params), 20))
    except (_OutOfTime, TimeoutError, RecursionError):
        raise UnusableSchema("Checking the parameters against the schema took too long.") from None
    finally:
        _deadline.reset(token)
    errors.sort(key=lambda error: [str(part) for part in error.absolute_path])
    return [
        f"{'/'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in errors
    ]


@functools.lru_cache(maxsize=256)
def _stored_schema_problem(canonical: str) -> str | None:
    # Keyed by the schema's content: the checks cost milliseconds (the metaschema above
    # all), and an automation's schema is the same for every job until it is changed.
    return params_schema_problem(json.loads(canonical))


class _OutOfTime(Exception):
    pass


_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("params_deadline")


def _remaining() -> float:
    left = _deadline.get() - time.monotonic()
    if left <= 0:
        raise _OutOfTime
    return left


def _search(pattern: str, text: str) -> bool:
    # The regex module's timeout raises TimeoutError once the budget is spent.
    return regex.search(pattern, text, timeout=_remaining()) is not None


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    properties = schema.get("properties", {})
    patterns = list(schema.get("patternProperties", {}))
    extras = [
        key
        for key in instance
        if key not in properties and not any(_search(pattern, key) for pattern in patterns)
    ]
    if validator.is_type(additional, "object"):
        for extra in extras:
            yield from validator.descend(instance[extra], additional, path=extra)
    elif not additional and extras:
        listed = ", ".join(repr(extra) for extra in sorted(extras))
        yield ValidationError(f"Additional properties are not allowed ({listed} unexpected)")


def _enum(validator, enums, instance, schema):
    # One keyword, many comparisons (a long enum, checked for every item of a long array):
    # the deadline is checked as it goes.
    for position, candidate in enumerate(enums):
        if position % 256 == 255:
            _remaining()
        if _comparable(candidate) == _comparable(instance):
            return
    yield ValidationError(f"{instance!r} is not one of {enums!r}"[:500])


def _unique_items(validator, unique, instance, schema):
    # jsonschema compares unhashable items pairwise: quadratic, minutes on 64 KiB of small
    # objects. Here each item gets a hashable form with the same equality (1 == 1.0, but
    # true is not 1), so it is one pass.
    if not unique or not validator.is_type(instance, "array"):
        return
    seen = set()
    for item in instance:
        key = _comparable(item)
        if key in seen:
            yield ValidationError(f"{instance!r} has non-unique elements")
            return
        seen.add(key)


def _comparable(value: Any) -> Any:
    if isinstance(value, bool) or value is None:
        return ("literal", value)
    if isinstance(value, int | float):
        return ("number", value)
    if isinstance(value, str):
        return ("string", value)
    if isinstance(value, list):
        return ("array", tuple(_comparable(item) for item in value))
    if isinstance(value, dict):
        return ("object", frozenset((key, _comparable(item)) for key, item in value.items()))
    return ("other", repr(value))


def _within_deadline(keyword):
    def check(validator, value, instance, schema):
        _remaining()
        yield from keyword(validator, value, instance, schema)

    return check


_BoundedValidator = validators.extend(
    Draft202012Validator,
    {
        **{
            name: _within_deadline(keyword)
            for name, keyword in Draft202012Validator.VALIDATORS.items()
        },
        "pattern": _within_deadline(_pattern),
        "patternProperties": _within_deadline(_pattern_properties),
        "additionalProperties": _within_deadline(_additional_properties),
        "uniqueItems": _within_deadline(_unique_items),
        "enum": _within_deadline(_enum),
    },
)
