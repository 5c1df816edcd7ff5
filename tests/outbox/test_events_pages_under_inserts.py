"""The events list paged while events keep being written: a walk down its pages lists
each event that was there when it started exactly once, and a walk back up its
``previous`` links lists the events written meanwhile too, none twice. Written from
another connection between the page reads, and committed, as the hub writes them."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from outbox.models import Event
from tests.clients import client_of
from tests.factories import ManagerFactory, TenantFactory

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/api/v1/events"


def record(tenant, n: int) -> Event:
    return Event.objects.create(
        type="JobCreated", aggregate_type="Job", aggregate_id=str(n), tenant=tenant, payload={}
    )


def written_elsewhere(tenants, count: int) -> list[int]:
    """``count`` events of each of ``tenants`` written and committed by another connection."""
    ids: list[int] = []

    def write() -> None:
        try:
            for n in range(count):
                ids.extend(record(tenant, 1000 + n).id for tenant in tenants)
        finally:
            connection.close()

    thread = threading.Thread(target=write)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive() and len(ids) == count * len(tenants)
    return ids


def page(client, url: str) -> dict:
    response = client.get(url)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert len(body["results"]) <= 4
    return body


def test_events_written_between_page_reads_are_neither_skipped_nor_repeated():
    tenant, other = TenantFactory(), TenantFactory()
    before = [record(tenant, n).id for n in range(10)]
    record(other, 0)
    client = client_of(ManagerFactory(tenant=tenant))

    seen, url, pages, written = [], f"{URL}?limit=4", [], []
    while url:
        body = page(client, url)
        pages.append(body)
        seen += [event["id"] for event in body["results"]]
        written += written_elsewhere([tenant, other], 3)
        url = body["next"]

    # Down: what was there when the walk began, newest first, each once.
    assert seen == sorted(before, reverse=True)
    # Back up from the last page: the same events, and those written meanwhile above
    # them, each once, never another tenant's.
    back, url = [], pages[-1]["previous"]
    while url:
        body = page(client, url)
        back += [event["id"] for event in body["results"]]
        url = body["previous"]
    mine = set(written) & set(Event.objects.filter(tenant=tenant).values_list("id", flat=True))
    assert len(back) == len(set(back))
    assert set(back) == (set(before) - {event["id"] for event in pages[-1]["results"]}) | mine
    assert not set(back) & set(Event.objects.filter(tenant=other).values_list("id", flat=True))
