from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from tests.factories import ManagerFactory, UserFactory
from tests.identity.support import client_for


@pytest.fixture
def api():
    return APIClient(raise_request_exception=False)


@pytest.fixture
def manager(tenant):
    return ManagerFactory(tenant=tenant)


@pytest.fixture
def member(tenant):
    return UserFactory(tenant=tenant)


@pytest.fixture
def outsider(other_tenant):
    """A manager of another tenant."""
    return ManagerFactory(tenant=other_tenant)


@pytest.fixture
def as_admin(platform_admin):
    return client_for(platform_admin)


@pytest.fixture
def as_manager(manager):
    return client_for(manager)


@pytest.fixture
def as_member(member):
    return client_for(member)


@pytest.fixture
def as_outsider(outsider):
    return client_for(outsider)
