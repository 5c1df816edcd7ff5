"""An automation's parameter schema: refused at save when recursive, unresolvable or too
expensive; the same validator checks each job's parameters, with its work bounded."""

from __future__ import annotations

import json

import pytest

from automation.models import Automation
from automation.params_schema import params_errors, params_schema_problem
from job.models import Job
from tests.automation.test_admin import CHANGELIST, form_data
from tests.automation.test_api import payload
from tests.clients import client_of
from tests.factories import AutomationFactory, AutomationWithWorkerFactory, UserFactory

pytestmark = pytest.mark.django_db

RECURSIVE = {
    "the root": {"$ref": "#"},
    "the root, under a property": {"properties": {"a": {"$ref": "#"}}, "$ref": "#"},
    "a loop through $defs": {
        "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "$ref": "#/$defs/a",
    },
    "a loop through allOf": {
        "$defs": {"a": {"allOf": [{"$ref": "#/$defs/a"}]}},
        "$ref": "#/$defs/a",
    },
    "a loop through an anchor": {"$defs": {"a": {"$anchor": "x", "anyOf": [{"$ref": "#x"}]}}},
    "a loop through $dynamicRef": {
        "$dynamicAnchor": "node",
        "properties": {"child": {"$dynamicRef": "#node"}},
        "$ref": "#/properties/child",
    },
    "a self-referencing $dynamicRef": {"$dynamicAnchor": "meta", "$dynamicRef": "#meta"},
    "a tree": {  # recursive through data: still refused, no schema here needs it
        "$defs": {"node": {"properties": {"children": {"items": {"$ref": "#/$defs/node"}}}}},
        "$ref": "#/$defs/node",
    },
}

TOO_EXPENSIVE = {
    "too many subschemas": {"properties": {f"p{n}": {"type": "string"} for n in range(3000)}},
    "too deep": json.loads('{"not": ' * 60 + "{}" + "}" * 60),
    "a pattern the regex engine cannot compile": {"pattern": "(?<=a+)b"},
    "too long a pattern": {"pattern": "a" * 5000},
    # The engines parse nested groups recursively: RecursionError (a 500) at a few hundred.
    "a pattern nested too deep": {"pattern": "(" * 500 + ")" * 500},
    # The regex engine unrolls counted repeats: 0.8 s to compile this one...
    "a pattern whose repeats multiply": {"pattern": "(?:a{1000}){1000}"},
    # ... and many under the bound each, together over it.
    "patterns whose repeats add up": {
        "properties": {f"p{n}": {"pattern": "(?:a{100}){100}"} for n in range(11)}
    },
}

# A "$ref" must land on a subschema: one pointing into a value (const, enum, default,
# examples) reaches JSON the save-time checks never walked, or no schema at all.
REFERENCES_INTO_VALUES = {
    "into a const, around the pattern checks": {
        "$ref": "#/$defs/h/const",
        "$defs": {"h": {"const": {"patternProperties": {"^(a*)*b$": {}}}}},
        "unevaluatedProperties": False,
    },
    "into an enum's number": {"$defs": {"a": {"enum": [1]}}, "$ref": "#/$defs/a/enum/0"},
    "into a const's string": {"$defs": {"a": {"const": "x"}}, "$ref": "#/$defs/a/const"},
    "into a default's list": {"$defs": {"a": {"default": [1]}}, "$ref": "#/$defs/a/default"},
    "into a default, back to itself": {"default": {"$ref": "#/default"}, "$ref": "#/default"},
    "a $dynamicRef into examples": {
        "$defs": {"a": {"examples": [{"type": "string"}]}},
        "$dynamicRef": "#/$defs/a/examples/0",
    },
}


@pytest.mark.parametrize("schema", list(RECURSIVE.values()), ids=list(RECURSIVE))
def test_a_recursive_schema_is_refused_when_saved(admin_api, sector, schema):
    response = admin_api.post(
        "/api/v1/automations", payload(sector, params_schema=schema), format="json"
    )

    assert response.status_code == 400, response.content
    assert "params_schema" in response.json()["error"]["details"]
    assert "recursive" in response.json()["error"]["details"]["params_schema"][0]
    assert not Automation.objects.exists()


@pytest.mark.parametrize("schema", list(TOO_EXPENSIVE.values()), ids=list(TOO_EXPENSIVE))
def test_a_schema_too_expensive_to_check_is_refused_when_saved(admin_api, sector, schema):
    response = admin_api.post(
        "/api/v1/automations", payload(sector, params_schema=schema), format="json"
    )

    assert response.status_code == 400, response.content
    assert "params_schema" in response.json()["error"]["details"]
    assert not Automation.objects.exists()


@pytest.mark.parametrize(
    "schema", list(REFERENCES_INTO_VALUES.values()), ids=list(REFERENCES_INTO_VALUES)
)
def test_a_reference_into_a_value_is_refused_when_saved(admin_api, sector, schema):
    response = admin_api.post(
        "/api/v1/automations", payload(sector, params_schema=schema), format="json"
    )

    assert response.status_code == 400, response.content
    assert (
        "does not point at a subschema" in (response.json()["error"]["details"]["params_schema"][0])
    )
    assert not Automation.objects.exists()


def test_a_reference_to_a_boolean_schema_is_accepted():
    assert params_schema_problem({"$defs": {"any": True}, "$ref": "#/$defs/any"}) is None


def test_a_recursive_schema_is_refused_on_update(admin_api, sector):
    automation = AutomationWithWorkerFactory(sector=sector)

    response = admin_api.patch(
        f"/api/v1/automations/{automation.pk}", {"params_schema": {"$ref": "#"}}, format="json"
    )

    assert response.status_code == 400, response.content
    automation.refresh_from_db()
    assert automation.params_schema != {"$ref": "#"}


def test_the_admin_refuses_a_recursive_schema(admin_site, sector):
    response = admin_site.post(
        f"{CHANGELIST}add/", form_data(sector, params_schema='{"$ref": "#"}')
    )

    assert response.status_code == 200
    assert "params_schema" in response.context["adminform"].form.errors
    assert not Automation.objects.exists()


@pytest.mark.parametrize(
    "text",
    ['{"not": ' * 150 + "{}" + "}" * 150, "[" * 100_000 + "]" * 100_000],
    ids=["deeper-than-the-api-takes", "too-deep-to-parse"],
)
def test_the_admin_refuses_json_nested_too_deep_as_a_form_error(admin_site, sector, text):
    response = admin_site.post(f"{CHANGELIST}add/", form_data(sector, params_schema=text))

    assert response.status_code == 200
    assert "params_schema" in response.context["adminform"].form.errors
    assert not Automation.objects.exists()


def test_schemas_that_are_not_recursive_are_accepted():
    fine = [
        {"$defs": {"m": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/m"}}},
        # The same definition used twice is sharing, not a loop.
        {
            "$defs": {"m": {"type": "string"}},
            "properties": {"a": {"$ref": "#/$defs/m"}, "b": {"$ref": "#/$defs/m"}},
        },
        {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"type": "integer"}}, "$ref": "#/$defs/a"},
        {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "string"}}},
        {"properties": {"month": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}$"}}},
    ]
    for schema in fine:
        assert params_schema_problem(schema) is None, schema


@pytest.fixture
def member():
    return UserFactory()


def _stored(schema) -> Automation:
    """An automation whose schema was stored before the checks existed (bypassing them)."""
    automation = AutomationFactory()
    Automation.objects.filter(pk=automation.pk).update(params_schema=schema)
    return automation


@pytest.mark.parametrize("schema", list(RECURSIVE.values())[:4], ids=list(RECURSIVE)[:4])
def test_a_stored_recursive_schema_makes_job_creation_a_409_not_a_500(member, schema):
    automation = _stored(schema)

    response = client_of(member).post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"a": {"a": 1}}}, format="json"
    )

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "automation_misconfigured"
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("schema", "params"),
    [
        (REFERENCES_INTO_VALUES["into an enum's number"], {"a": 1}),
        (REFERENCES_INTO_VALUES["into a const's string"], {"a": 1}),
        # Unchecked, this one matched the key with Python's own engine: seconds, doubling
        # with each character.
        (REFERENCES_INTO_VALUES["into a const, around the pattern checks"], {"a" * 40: 1}),
    ],
    ids=["enum", "const", "const-pattern"],
)
def test_a_stored_schema_referring_into_a_value_makes_job_creation_a_409(member, schema, params):
    automation = _stored(schema)

    response = client_of(member).post(
        "/api/v1/jobs", {"automation": automation.pk, "params": params}, format="json"
    )

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "automation_misconfigured"
    assert "does not point at a subschema" in error["details"]["params_schema"][0]
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("schema", "params"),
    [
        ({"properties": {"name": {"pattern": "^(a|aa)+$"}}}, {"name": "a" * 60 + "!"}),
        ({"patternProperties": {"^(a|aa)+$": {}}}, {"a" * 60 + "!": 1}),
        ({"propertyNames": {"pattern": "^(a|a)*$"}}, {"a" * 40 + "!": 1}),
        (
            {"patternProperties": {"^(a|a)*$": {}}, "additionalProperties": False},
            {"a" * 40 + "!": 1},
        ),
    ],
    ids=["pattern", "patternProperties", "propertyNames", "additionalProperties"],
)
def test_a_pattern_that_backtracks_on_the_params_is_bounded(member, settings, schema, params):
    # A pattern that backtracks catastrophically is valid at save: whether it does depends
    # on the input, so its matching is what is bounded, whatever the tenant sends.
    settings.JOB_PARAMS_VALIDATION_SECONDS = 0.1
    assert params_schema_problem(schema) is None
    automation = _stored(schema)

    response = client_of(member).post(
        "/api/v1/jobs", {"automation": automation.pk, "params": params}, format="json"
    )

    assert response.status_code == 409, response.content
    assert response.json()["error"]["code"] == "automation_misconfigured"
    assert not Job.objects.exists()


def test_the_same_pattern_still_validates_what_it_matches_quickly(member):
    automation = _stored({"properties": {"name": {"pattern": "^(a+)+$"}}})
    client = client_of(member)

    accepted = client.post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"name": "aaa"}}, format="json"
    )
    refused = client.post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"name": "b"}}, format="json"
    )

    assert accepted.status_code == 201, accepted.content
    assert refused.status_code == 400
    assert refused.json()["error"]["code"] == "invalid_params"


def test_unique_items_over_many_objects_is_checked_in_one_pass(member, settings):
    # jsonschema's own check compares unhashable items pairwise: minutes for 64 KiB.
    settings.JOB_PARAMS_MAX_BYTES = 64 * 1024
    automation = _stored({"properties": {"x": {"uniqueItems": True}}})
    client = client_of(member)
    distinct = [{"a": n} for n in range(4000)]

    accepted = client.post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"x": distinct}}, format="json"
    )
    refused = client.post(
        "/api/v1/jobs",
        {"automation": automation.pk, "params": {"x": [*distinct, {"a": 7.0}]}},
        format="json",
    )

    assert accepted.status_code == 201, accepted.content
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["code"] == "invalid_params"


@pytest.mark.parametrize(
    ("items", "unique"),
    [
        ([1, 1.0], False),
        ([1, True], True),
        ([0, False], True),
        ([None, False], True),
        ([{"a": [1, {"b": 2}]}, {"a": [1, {"b": 2.0}]}], False),
        ([[1, 2], [2, 1]], True),
        (["1", 1], True),
    ],
)
def test_unique_items_keeps_json_schemas_equality(items, unique):
    schema = {"properties": {"x": {"uniqueItems": True}}}

    assert (params_errors({"x": items}, schema) == []) is unique


def test_a_schema_over_the_size_limit_is_refused():
    schema = {"enum": ["x" * 100] * 700}

    assert "bytes" in params_schema_problem(schema)


def test_a_long_enum_against_a_long_array_is_bounded(member, settings):
    settings.JOB_PARAMS_VALIDATION_SECONDS = 0.05
    automation = _stored({"properties": {"x": {"items": {"enum": list(range(5000))}}}})

    response = client_of(member).post(
        "/api/v1/jobs",
        {"automation": automation.pk, "params": {"x": [-1] * 20000}},
        format="json",
    )

    assert response.status_code in (400, 409), response.content
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("value", "valid"), [(1, True), (1.0, True), (True, False), ("1", False), ([1], True)]
)
def test_enum_keeps_json_schemas_equality(value, valid):
    schema = {"properties": {"x": {"enum": [1, [1.0], None]}}}

    assert (params_errors({"x": value}, schema) == []) is valid


def test_a_schema_the_validator_cannot_apply_makes_job_creation_a_409(member, monkeypatch):
    # Whatever the checks at save miss, the validator failing on a tenant's schema is the
    # automation's problem to fix, told as such, never a 500.
    from automation import params_schema

    def broken(self, instance):
        raise TypeError("argument of type 'int' is not iterable")

    monkeypatch.setattr(params_schema._BoundedValidator, "iter_errors", broken)
    automation = _stored({"properties": {"a": {"type": "string"}}})

    response = client_of(member).post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"a": "x"}}, format="json"
    )

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "automation_misconfigured"
    assert error["details"]["params_schema"] == [
        "The schema could not be applied to the parameters (TypeError)."
    ]


@pytest.mark.parametrize(
    ("schema", "number"),
    [
        ({"properties": {"x": {"multipleOf": 1e-308}}}, 10**4000),
        ({"properties": {"x": {"multipleOf": 10**400}}}, 1.5),
        ({"properties": {"x": {"multipleOf": 0.3}}}, 10**4000 + 1),
    ],
    ids=["huge-number-tiny-divisor", "huge-divisor", "huge-number-float-divisor"],
)
def test_a_number_past_floats_range_is_checked_exactly_not_blamed_on_the_schema(
    member, schema, number
):
    # jsonschema divides in floats: these raised OverflowError, read as a broken schema
    # (a 409 and an error with its traceback in the log, for a number a member sent).
    assert params_schema_problem(schema) is None
    automation = _stored(schema)

    response = client_of(member).post(
        "/api/v1/jobs", {"automation": automation.pk, "params": {"x": number}}, format="json"
    )

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid_params"
    assert "is not a multiple of" in error["details"]["params"][0]


def test_multiples_past_floats_range_are_valid():
    assert params_errors({"x": 10**4000}, {"properties": {"x": {"multipleOf": 0.5}}}) == []
    assert params_errors({"x": 2 * 10**400}, {"properties": {"x": {"multipleOf": 10**400}}}) == []


def test_params_a_pattern_backtracks_on_are_a_warning_in_the_log_not_an_error(
    member, settings, caplog
):
    # Any member can send them: one error line each would be theirs to raise at will in
    # the operators' alerts. The schema is still named as the thing to fix.
    settings.JOB_PARAMS_VALIDATION_SECONDS = 0.1
    automation = _stored({"properties": {"name": {"pattern": "^(a|aa)+$"}}})

    response = client_of(member).post(
        "/api/v1/jobs",
        {"automation": automation.pk, "params": {"name": "a" * 60 + "!"}},
        format="json",
    )

    assert response.status_code == 409, response.content
    error = response.json()["error"]
    assert error["code"] == "automation_misconfigured"
    assert "took too long" in error["details"]["params_schema"][0]
    assert "nothing can be started" not in error["message"]
    mine = [r for r in caplog.records if r.name.startswith("hubdommed")]
    assert [r.levelname for r in mine if "schema" in r.getMessage()] == ["WARNING"]
