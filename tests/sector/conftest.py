from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from outbox.models import Event
from tests.factories import SectorFactory, UserFactory


@pytest.fixture
def person(db):
    return UserFactory()


@pytest.fixture
def admin_api(platform_admin) -> APIClient:
    client = APIClient()
    client.force_authenticate(platform_admin)
    return client


@pytest.fixture
def person_api(person) -> APIClient:
    client = APIClient()
    client.force_authenticate(person)
    return client


@pytest.fixture
def admin_site(client, platform_admin):
    """Django's test client, logged in to the admin as a superuser."""
    client.force_login(platform_admin)
    return client


@pytest.fixture
def sector(db):
    return SectorFactory()


@pytest.fixture
def events():
    """The event types recorded so far, oldest first."""

    def recorded(**filters) -> list[str]:
        return list(Event.objects.filter(**filters).order_by("id").values_list("type", flat=True))

    return recorded
