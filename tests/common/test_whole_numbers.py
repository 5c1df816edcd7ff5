"""Whole numbers as the client wrote them: ``"1_0"`` is not ten, ``"+5"`` and ``" 5 "`` are not
five, whatever field or query parameter of the API reads them (``common.api.WholeNumberField``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from django.apps import apps
from django.conf import settings
from rest_framework import serializers
from rest_framework.test import APIClient

from automation.models import Automation
from common.api import WholeNumberField
from tests.automation.test_api import payload
from tests.factories import ManagerFactory, PlatformAdminFactory, SectorFactory, bearer

SLIPS = ["1_0", "+5", " 5", "5 ", "\u0665", "5.0", "", "0x10", "1e3"]


@pytest.mark.parametrize("value", SLIPS)
def test_a_string_that_is_not_plain_digits_is_refused(value):
    with pytest.raises(serializers.ValidationError):
        WholeNumberField().run_validation(value)


@pytest.mark.parametrize(
    ("value", "read"), [(5, 5), (-5, -5), ("5", 5), ("-5", -5), ("007", 7), (5.0, 5)]
)
def test_what_a_client_writes_for_a_whole_number_is_read_as_written(value, read):
    assert WholeNumberField().run_validation(value) == read


@pytest.mark.parametrize("value", [True, 5.5, "5.5", None, [5], {"n": 5}])
def test_what_drf_refused_stays_refused(value):
    with pytest.raises(serializers.ValidationError):
        WholeNumberField().run_validation(value)


def _project_serializers() -> list[type[serializers.Serializer]]:
    """Every serializer class of the project's apps (their API modules imported)."""
    for config in _project_configs():
        for module in ("api", "api.serializers"):
            try:
                importlib.import_module(f"{config.name}.{module}")
            except ModuleNotFoundError as exc:
                if exc.name is None or not exc.name.startswith(config.name):
                    raise
    found, pending = set(), [serializers.Serializer]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if cls.__module__.split(".")[0] in _project_apps():
            found.add(cls)
    return sorted(found, key=lambda cls: f"{cls.__module__}.{cls.__qualname__}")


def _project_configs():
    """The project's own apps: those whose folder is the project's (not a library's,
    wherever the virtual environment is)."""
    return [
        config
        for config in apps.get_app_configs()
        if Path(config.path) == Path(settings.BASE_DIR) / config.name.split(".")[0]
    ]


def _project_apps() -> set[str]:
    return {config.name.split(".")[0] for config in _project_configs()}


# Answers the API writes, never reads (their fields only turn numbers into JSON).
ANSWERS = {"identity.api.serializers.TokenPairSerializer"}


def _reads(cls: type[serializers.Serializer]) -> bool:
    name = f"{cls.__module__}.{cls.__qualname__}"
    return not cls.__name__.endswith("Output") and name not in ANSWERS


def test_every_whole_number_the_api_reads_goes_through_the_strict_field():
    classes = [cls for cls in _project_serializers() if _reads(cls)]
    assert len(classes) > 20, classes  # the walk found the API's serializers
    lenient = []
    for cls in classes:
        for name, field in cls().fields.items():
            if (
                isinstance(field, serializers.IntegerField)
                and not field.read_only
                and not isinstance(field, WholeNumberField)
            ):
                lenient.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    assert lenient == [], "\n".join(lenient)


@pytest.mark.django_db
@pytest.mark.parametrize("value", ["1_0", "+2", " 2"])
def test_a_body_field_with_a_slip_is_a_400_and_nothing_is_created(value):
    admin_api = APIClient()
    admin_api.force_authenticate(PlatformAdminFactory())

    response = admin_api.post(
        "/api/v1/automations", payload(SectorFactory(), max_attempts=value), format="json"
    )

    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["code"] == "invalid" and "max_attempts" in error["details"]
    assert not Automation.objects.exists()


@pytest.mark.django_db
def test_a_query_parameter_with_a_slip_is_a_400(client):
    manager = ManagerFactory()

    response = client.get("/api/v1/jobs?limit=1_0", HTTP_AUTHORIZATION=bearer(manager))

    assert response.status_code == 400, response.content
    assert "limit" in response.json()["error"]["details"]
