"""The database gone away is an outage, not a bug: a 503 in the one error format, which a
client may retry, never a 500; and the next request after its return is served."""

from __future__ import annotations

import contextlib

import pytest
from django.db import connection
from rest_framework.test import APIClient

from identity.tokens import issue_access_token
from tests.ports import free_port

# Closing the connection mid-test needs a real transaction, not the test's wrapping one.
pytestmark = pytest.mark.django_db(transaction=True)


@contextlib.contextmanager
def database_unreachable():
    """What a stopped PostgreSQL looks like to the API: the connection is gone and a new
    one is refused (a closed port on loopback)."""
    closed_port = free_port()
    saved = connection.settings_dict["PORT"]
    connection.close()
    connection.settings_dict["PORT"] = closed_port
    try:
        yield
    finally:
        connection.close()
        connection.settings_dict["PORT"] = saved


def test_a_request_while_the_database_is_down_is_a_503_in_the_error_format(user):
    api = APIClient(raise_request_exception=False)
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {issue_access_token(user).token}")

    with database_unreachable():
        response = api.get("/api/v1/jobs")

    assert response.status_code == 503, response.content
    assert response["Retry-After"]
    error = response.json()["error"]
    assert error["code"] == "unavailable"
    assert error["message"]
    # Back: served again, with no restart.
    assert api.get("/api/v1/jobs").status_code == 200
