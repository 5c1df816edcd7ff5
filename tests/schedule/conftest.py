"""Fixtures of the schedules tests: a tenant's manager and member, an automation."""

from __future__ import annotations

import pytest

from tests.clients import client_of
from tests.factories import AutomationFactory, ManagerFactory, UserFactory


@pytest.fixture
def automation(db):
    return AutomationFactory(
        params_schema={
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        }
    )


@pytest.fixture
def manager(tenant):
    return ManagerFactory(tenant=tenant)


@pytest.fixture
def member(tenant):
    return UserFactory(tenant=tenant)


@pytest.fixture
def manager_api(manager):
    return client_of(manager)


@pytest.fixture
def member_api(member):
    return client_of(member)


@pytest.fixture
def admin_site(client, platform_admin):
    """Django's test client, logged in to the admin as a superuser."""
    client.force_login(platform_admin)
    return client
