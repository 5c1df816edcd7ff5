"""API clients that call as one person: the one home of "a client as this user"."""

from __future__ import annotations

from rest_framework.test import APIClient

from tests.factories import bearer


def client_of(person, *, token: bool = False, raise_request_exception: bool = True) -> APIClient:
    """An API client calling as ``person``.

    By default DRF takes the client as ``person`` outright (``force_authenticate``): the
    test is about what the view does for them. ``token=True`` sends a bearer access token
    instead, through the authentication a real caller goes through.
    ``raise_request_exception=False``: an unexpected exception comes back as the 500 a
    caller would get, for the tests that assert there is none.
    """
    client = APIClient(raise_request_exception=raise_request_exception)
    if token:
        client.credentials(HTTP_AUTHORIZATION=bearer(person))
    else:
        client.force_authenticate(person)
    return client
