"""Helpers for reading metrics and log lines the way operators' tools read them."""

from __future__ import annotations

import io
import json
import logging

import pytest
from django.conf import settings
from django.utils.module_loading import import_string
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from common.logs import ContextFilter


def sample(name: str, **labels: str) -> float:
    """This process's value of a sample (0 when it does not exist yet)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def samples(exposition: str) -> dict[tuple[str, frozenset], float]:
    """Every sample of a text exposition, by name and labels."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def configured_formatter(name: str) -> logging.Formatter:
    """The formatter ``name`` exactly as ``settings.LOGGING`` builds it."""
    config = dict(settings.LOGGING["formatters"][name])
    return import_string(config.pop("()"))(**config)


class LogLines:
    """The lines a logger writes through the production handler's filter and formatter."""

    def __init__(self, formatter: str) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.addFilter(ContextFilter())
        self.handler.setFormatter(configured_formatter(formatter))

    @property
    def text(self) -> str:
        return self.stream.getvalue()

    def json(self) -> list[dict]:
        return [json.loads(line) for line in self.text.splitlines() if line.strip()]


@pytest.fixture
def json_lines():
    """JSON lines of every logger (the root's handler), at DEBUG, for the test's duration."""
    lines = LogLines("json")
    root = logging.getLogger()
    level = root.level
    root.addHandler(lines.handler)
    root.setLevel(logging.DEBUG)
    yield lines
    root.removeHandler(lines.handler)
    root.setLevel(level)


# The whole system (live server, relay, workers as processes) of the end-to-end tests.
from tests.e2e.conftest import api, broker_names, catalog, person, system  # noqa: E402, F401
