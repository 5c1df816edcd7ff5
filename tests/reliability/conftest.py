"""Fixtures of the reliability scenarios: a scenario's own database, its processes (always
stopped, even when the test fails or times out), and the figures each one prints.

``make test`` runs the quick form; ``make chaos`` (``CHAOS=full``) the issue's numbers and
the soak.
"""

from __future__ import annotations

import contextlib
import uuid

import pytest
from django.conf import settings

from tests.reliability.support import BOOK, Stack, create_database, drop_database, migrate


def _shared_url(name: str) -> str:
    db = settings.DATABASES["default"]
    user, host, port = db["USER"] or "postgres", db["HOST"] or "127.0.0.1", db["PORT"] or 5432
    return f"postgres://{user}@{host}:{port}/{name}"


def _base_name() -> str:
    return settings.DATABASES["default"]["NAME"].removeprefix("test_")


@pytest.fixture(scope="session")
def migrated_template():
    """A migrated database on the shared PostgreSQL that scenarios copy (copying is
    instant; migrating takes half a minute)."""
    # Its own per session: two runs on one machine must not drop each other's template.
    name = f"{_base_name()}_rel_template_{uuid.uuid4().hex[:6]}"[:63]
    url = _shared_url(name)
    create_database(url)
    migrate(url)
    yield name
    drop_database(url)


@pytest.fixture
def scenario_database(migrated_template):
    """A database of the test's own on the shared PostgreSQL, dropped at its end."""
    url = _shared_url(f"{_base_name()}_rel_{uuid.uuid4().hex[:8]}"[:63])
    create_database(url, template=migrated_template)
    yield url
    drop_database(url)


@pytest.fixture
def make_stack(tmp_path):
    """Builds the scenario's ``Stack``; its processes are stopped whatever happens."""
    stacks: list[Stack] = []

    def make(**kwargs) -> Stack:
        stack = Stack(tmp_path / f"stack{len(stacks)}", **kwargs)
        stacks.append(stack)
        return stack

    yield make
    for stack in stacks:
        with contextlib.suppress(Exception):
            stack.close()


@pytest.fixture
def figures(tmp_path):
    """Record a scenario's figures: printed, kept in var/reliability/ and the tmp dir."""

    def record(value):
        BOOK.record(value, tmp_path)
        return value

    return record


def pytest_terminal_summary(terminalreporter):
    if BOOK.figures:
        terminalreporter.section("reliability figures")
        for value in BOOK.figures:
            terminalreporter.write_line(value.line())
