"""A cursor of the events list whose position is no id the API could have issued is a 400
``invalid_cursor``, however its digits are written: never a 500, never a page."""

from __future__ import annotations

import base64

import pytest

from outbox.models import Event
from tests.clients import client_of
from tests.factories import ManagerFactory

pytestmark = pytest.mark.django_db

URL = "/api/v1/events"


def cursor_at(position: str) -> str:
    # As DRF writes a cursor: its fields percent-encoded, then base64.
    return base64.b64encode(f"o=0&p={position}".encode()).decode()


@pytest.mark.parametrize(
    "position",
    [
        "%C2%B2",  # a superscript two: a digit to str.isdigit(), none to int()
        "1%C2%B2",
        "%D9%A5",  # an Arabic-Indic five: int() reads it, the API never writes it
        "%EF%BC%95",  # a fullwidth five
        "%00",
        "5%00",
    ],
)
def test_a_position_in_digits_the_api_never_writes_is_an_invalid_cursor(tenant, position):
    Event.objects.create(
        type="JobCreated", aggregate_type="Job", aggregate_id="1", tenant=tenant, payload={}
    )
    client = client_of(ManagerFactory(tenant=tenant), raise_request_exception=False)

    response = client.get(URL, {"cursor": cursor_at(position)})

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "invalid_cursor"


def test_a_position_the_api_wrote_still_pages(tenant):
    events = [
        Event.objects.create(
            type="JobCreated", aggregate_type="Job", aggregate_id=str(n), tenant=tenant, payload={}
        )
        for n in range(3)
    ]
    client = client_of(ManagerFactory(tenant=tenant))

    response = client.get(URL, {"cursor": cursor_at(str(events[2].id))})

    assert response.status_code == 200, response.json()
    assert [event["id"] for event in response.json()["results"]] == [events[1].id, events[0].id]
