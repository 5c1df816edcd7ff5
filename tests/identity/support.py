"""Helpers for the identity tests (fixtures are in conftest.py)."""

from __future__ import annotations

from functools import partial

from rest_framework.test import APIClient

from outbox.models import Event, OutboxMessage, PlatformOutboxMessage
from tests.clients import client_of
from tests.factories import DEFAULT_PASSWORD

# A bearer token, as callers send it; a crash is the 500 they would get, not raised.
client_for = partial(client_of, token=True, raise_request_exception=False)


def error_of(response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert set(error) == {"code", "message", "details"}
    if code is not None:
        assert error["code"] == code, error
    return error


def login(api: APIClient, email: str, password: str = DEFAULT_PASSWORD, **extra):
    return api.post(
        "/api/v1/auth/login", {"email": email, "password": password}, format="json", **extra
    )


def refresh(api: APIClient, token: str):
    return api.post("/api/v1/auth/refresh", {"refresh_token": token}, format="json")


def events(type_: str) -> list[Event]:
    return list(Event.objects.filter(type=type_).order_by("id"))


def outbox_counts() -> tuple[int, int, int]:
    """(events, tenant outbox rows, platform outbox rows): nothing written shows as no change."""
    return (
        Event.objects.count(),
        OutboxMessage.objects.count(),
        PlatformOutboxMessage.objects.count(),
    )
