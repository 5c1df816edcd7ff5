import pytest
from django.test import Client

from tests.factories import PlatformAdminFactory


@pytest.fixture
def admin_client():
    """A platform admin's browser: a page's error is its answer (500), not an exception."""
    client = Client(raise_request_exception=False)
    client.force_login(PlatformAdminFactory())
    return client
