"""An automation's parameter schema, and the jobs' parameters checked against it.

One validator for an automation's parameter schema: ``params_schema_problem`` when the
automation is saved (API and admin), ``params_errors`` when a job is created, which runs
the same checks first so that a schema stored before them is refused the same way.

A schema is refused when it is recursive (a $ref, $dynamicRef or anchor leading back to
where it started: jsonschema then recurses until RecursionError), unresolvable, when a
reference lands anywhere but on a subschema (inside a ``const``, an ``enum``, a
``default`` or ``examples``: JSON the checks never walked, or no schema at all), or too
big: in bytes, subschemas, depth, and in what its patterns cost to compile (their
nesting, and their counted repeats, which the regex engine unrolls). Regular expressions
(pattern, patternProperties, and additionalProperties, which consults them) are matched
with the ``regex`` module under a timeout: whether a pattern backtracks catastrophically
depends on the input, and no syntactic rule (nested quantifiers, overlapping
alternatives...) catches every such pattern, whereas a time bound holds for all of them.
Everything else jsonschema does for one job is bounded by a deadline checked at every
keyword.
"""

from __future__ import annotations

import contextvars
import functools
import itertools
import json
import logging
import re
import time
from fractions import Fraction
from re import _constants as sre_constants
from re import _parser as sre_parser
from typing import Any

import regex
from django.conf import settings
from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing import Registry
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

logger = logging.getLogger("hubdommed.automation")

SCHEMA_MAX_BYTES = 64 * 1024
SCHEMA_MAX_SUBSCHEMAS = 1000
SCHEMA_MAX_DEPTH = 40
PATTERN_MAX_LENGTH = 1000
# Groups inside groups: the engines parse them recursively (RecursionError at a few hundred).
PATTERN_MAX_NESTING = 32
# What the regex engine makes of a pattern when it compiles it (``_unrolled``): a pattern
# at the bound compiles in about 10 ms, all of a schema's together in about 100 ms.
PATTERN_MAX_UNROLLED = 10_000
SCHEMA_MAX_UNROLLED = 100_000
# Keywords whose values are data, not subschemas: a "$ref" in there refers to nothing.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})


class UnusableSchema(Exception):
    """The stored schema cannot check parameters (refused by the save-time checks, or it
    took more than the budget on these parameters: ``TooCostly``)."""


class TooCostly(UnusableSchema):
    """The schema took more than ``JOB_PARAMS_VALIDATION_SECONDS`` on these parameters (a
    pattern that backtracks on them): other parameters may still be checked quickly."""


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
    # Before the metaschema's check, which compiles each pattern too.
    problem = _pattern_problem(nodes)
    if problem:
        return problem
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(part) for part in exc.path)
        return f"Not a valid JSON Schema (draft 2020-12): {exc.message}" + (
            f" at '{where}'." if where else "."
        )
    resolver = Registry().resolver_with_root(DRAFT202012.create_resource(schema))
    edges, problem = _reference_edges(nodes, resolver)
    if problem:
        return problem
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
    unrolled = 0
    for pattern in _patterns(nodes):
        if len(pattern) > PATTERN_MAX_LENGTH:
            return f"A pattern is longer than {PATTERN_MAX_LENGTH} characters."
        if _nesting(pattern) > PATTERN_MAX_NESTING:
            return (
                f"The pattern {pattern[:80]!r} nests groups more than {PATTERN_MAX_NESTING} deep."
            )
        try:
            size = _unrolled(sre_parser.parse(pattern))
        except (re.error, RecursionError, OverflowError) as exc:
            return f"The pattern {pattern[:80]!r} is not a valid regular expression: {exc}."
        if size > PATTERN_MAX_UNROLLED:
            return (
                f"The pattern {pattern[:80]!r} is too big once its counted repeats are "
                f"unrolled ({size} elements; at most {PATTERN_MAX_UNROLLED}): count with "
                "minLength, maxLength, minItems or maxItems instead."
            )
        unrolled += size
        if unrolled > SCHEMA_MAX_UNROLLED:
            return (
                f"The patterns are too big together once their counted repeats are unrolled "
                f"(more than {SCHEMA_MAX_UNROLLED} elements)."
            )
        try:
            regex.compile(pattern)
        except (regex.error, RecursionError) as exc:
            return f"The pattern {pattern[:80]!r} is not a valid regular expression: {exc}."
    # unevaluatedProperties consults patternProperties through jsonschema's own ``re``,
    # out of reach of the timeout: the two together are refused.
    uses = {key for node in nodes for key in node}
    if {"unevaluatedProperties", "patternProperties"} <= uses:
        return "unevaluatedProperties cannot be combined with patternProperties here."
    return None


_REPEATS = (sre_constants.MAX_REPEAT, sre_constants.MIN_REPEAT, sre_constants.POSSESSIVE_REPEAT)


def _nesting(pattern: str) -> int:
    """How deep the pattern's groups nest (escapes and character classes skipped)."""
    depth = deepest = 0
    index, in_class = 0, False
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
            continue
        if in_class:
            in_class = char != "]"
        elif char == "[":
            in_class = True
            # A "]" first in the class (after a "^") is one of its characters.
            index += 1 + (pattern[index + 1 : index + 2] == "^")
            index += pattern[index : index + 1] == "]"
            continue
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth = max(depth - 1, 0)
        index += 1
    return deepest


def _unrolled(items) -> int:
    """About how many elements the regex engine compiles for a parsed pattern: one an
    element, a counted repeat's body as many times as its minimum (``(?:a{1000}){1000}``
    is a million, and takes it a second), every branch of an alternation."""
    size = 0
    for op, value in items:
        if op in _REPEATS:
            low, _high, body = value
            size += max(low, 1) * _unrolled(body)
        elif op is sre_constants.SUBPATTERN:
            size += _unrolled(value[-1])
        elif op is sre_constants.BRANCH:
            size += sum(_unrolled(branch) for branch in value[1])
        elif op in (sre_constants.ASSERT, sre_constants.ASSERT_NOT):
            size += _unrolled(value[1])
        elif op is sre_constants.ATOMIC_GROUP:
            size += _unrolled(value)
        elif op is sre_constants.GROUPREF_EXISTS:
            size += _unrolled(value[1]) + (_unrolled(value[2]) if value[2] else 0)
        else:
            size += 1
    return size


def _reference_edges(nodes, resolver) -> tuple[dict[int, list[int]], str | None]:
    """Where each subschema leads: its children, and the targets of its references; or
    why a reference cannot be followed.

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
                return edges, (
                    f"The reference {ref!r} leads nowhere in this schema: references must "
                    "point inside it (the hub never fetches schemas from elsewhere)."
                )
            if id(target) in known:
                targets.append(id(target))
            elif not isinstance(target, bool):
                # Inside a value (const, enum, default, examples): JSON none of these
                # checks walked, or no schema at all. A boolean is a schema of its own.
                return edges, (
                    f"The reference {ref!r} does not point at a subschema: it lands inside "
                    "a value (const, enum, default or examples)."
                )
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
        raise TooCostly("Checking the parameters against the schema took too long.") from None
    except Exception as exc:
        # A schema the checks above let through that the validator still cannot apply: the
        # automation's to fix, not a failure of the request.
        logger.exception("a parameter schema the checks accepted failed to validate")
        raise UnusableSchema(
            f"The schema could not be applied to the parameters ({type(exc).__name__})."
        ) from None
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


def _multiple_of(validator, divisor, instance, schema):
    # jsonschema divides in floats, which a number past their range (an integer of a
    # thousand digits, a divisor of 1e-308) overflows: its OverflowError would blame the
    # schema for the number a tenant sent. Fractions are exact and do not overflow.
    if not validator.is_type(instance, "number"):
        return
    try:
        yield from _JSONSCHEMA_MULTIPLE_OF(validator, divisor, instance, schema)
        return
    except OverflowError:
        pass
    if (Fraction(instance) / Fraction(divisor)).denominator != 1:
        yield ValidationError(f"{instance!r}"[:100] + f" is not a multiple of {divisor!r}"[:100])


_JSONSCHEMA_MULTIPLE_OF = Draft202012Validator.VALIDATORS["multipleOf"]


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
        "multipleOf": _within_deadline(_multiple_of),
    },
)
