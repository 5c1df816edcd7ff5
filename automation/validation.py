"""The rules an automation and its worker's machine must satisfy.

Shared by the services (the API) and the Django admin's forms, so both refuse the same
input with the same messages. Each function returns ``{field: [message, ...]}``; empty
means valid. Only the fields present are checked, so updates validate what they change.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.validators import validate_slug

from automation.params_schema import params_schema_problem

# PostgreSQL integer, the column type of PositiveIntegerField.
MAX_INT = 2_147_483_647
NAME_MAX_LENGTH = 200
SLUG_MAX_LENGTH = 120
MACHINE_ID_MAX_LENGTH = 200
REGION_MAX_LENGTH = 64
PROVIDERS = ("local", "ec2")
EC2_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
AT_LEAST_ONE = ("max_concurrency", "timeout_seconds", "max_attempts")

Errors = dict[str, list[str]]


def automation_errors(fields: Mapping[str, Any]) -> Errors:
    errors: Errors = {}
    if "name" in fields:
        name = fields["name"]
        if not isinstance(name, str) or not name.strip():
            errors["name"] = ["A name is required."]
        elif len(name.strip()) > NAME_MAX_LENGTH:
            errors["name"] = [f"At most {NAME_MAX_LENGTH} characters."]
    if fields.get("slug"):
        _check_slug(fields["slug"], errors)
    if "description" in fields and not isinstance(fields["description"], str):
        errors["description"] = ["Must be text."]
    if "command" in fields:
        problem = _command_problem(fields["command"])
        if problem:
            errors["command"] = [problem]
    for field in AT_LEAST_ONE:
        if field in fields:
            value = fields[field]
            if not isinstance(value, int) or isinstance(value, bool):
                errors[field] = ["Must be a whole number."]
            elif not 1 <= value <= MAX_INT:
                errors[field] = [f"Must be at least 1 (and at most {MAX_INT})."]
    if "params_schema" in fields:
        problem = params_schema_problem(fields["params_schema"])
        if problem:
            errors["params_schema"] = [problem]
    return errors


def machine_errors(*, provider: Any, machine_id: Any, region: Any) -> Errors:
    errors: Errors = {}
    if provider not in PROVIDERS:
        errors["provider"] = [f"Must be one of: {', '.join(PROVIDERS)}."]
    if not isinstance(machine_id, str):
        errors["machine_id"] = ["Must be text."]
    elif len(machine_id) > MACHINE_ID_MAX_LENGTH:
        errors["machine_id"] = [f"At most {MACHINE_ID_MAX_LENGTH} characters."]
    elif provider == "ec2" and not EC2_INSTANCE_ID.match(machine_id):
        errors["machine_id"] = ["An EC2 worker needs its instance id (i-0123456789abcdef0)."]
    if not isinstance(region, str):
        errors["region"] = ["Must be text."]
    elif len(region) > REGION_MAX_LENGTH:
        errors["region"] = [f"At most {REGION_MAX_LENGTH} characters."]
    return errors


def _check_slug(slug: Any, errors: Errors) -> None:
    if not isinstance(slug, str):
        errors["slug"] = ["Must be text."]
        return
    try:
        validate_slug(slug)
    except DjangoValidationError:
        errors["slug"] = ["Letters, numbers, underscores or hyphens only."]
        return
    if len(slug) > SLUG_MAX_LENGTH:
        errors["slug"] = [f"At most {SLUG_MAX_LENGTH} characters."]


def _command_problem(command: Any) -> str | None:
    # An argument list, executed without a shell: no quoting or injection to worry about.
    if not isinstance(command, list) or not command:
        return 'Must be a non-empty list of arguments, e.g. ["python", "run.py"].'
    for position, argument in enumerate(command):
        if not isinstance(argument, str) or not argument:
            return f"Argument {position} must be a non-empty string."
    return None
