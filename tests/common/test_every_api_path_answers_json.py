"""Every route under /api/ and /health/, found through the URL resolver, answers JSON in
the one error format to every method it refuses, and to its slashed or unslashed twin."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver

pytestmark = pytest.mark.django_db

METHODS = ["get", "post", "put", "patch", "delete", "head", "options"]
# People's pages under /api/: HTML (the docs) or YAML (the schema) when they succeed.
PAGES = {"api/docs/", "api/redoc/", "api/schema/"}


def routes() -> list[str]:
    """Every concrete path of the project's URLconf under api/ and health/, its arguments
    filled with a plausible value."""
    found: list[str] = []

    def walk(patterns, prefix: str) -> None:
        for entry in patterns:
            route = str(entry.pattern)
            if isinstance(entry, URLResolver):
                walk(entry.url_patterns, prefix + route)
            elif isinstance(entry, URLPattern):
                full = prefix + route
                if full.startswith(("api/", "health/")) and not full.startswith("^"):
                    found.append(re.sub(r"<(?:\w+:)?\w+>", "1", full))

    walk(get_resolver().url_patterns, "")
    return sorted(set(found))


ROUTES = routes()


def test_the_walk_finds_the_api():
    assert "api/v1/jobs" in ROUTES and "health/ready" in ROUTES
    assert len(ROUTES) > 15


def assert_json(response, path: str, method: str) -> None:
    context = f"{method.upper()} /{path}: {response.status_code}"
    assert response.status_code < 500, context
    if path in PAGES and response.status_code < 400:
        return
    assert response["Content-Type"].startswith("application/json"), (
        context + " " + response["Content-Type"]
    )
    if method == "head" or response.status_code < 400:
        return
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}, (
        context,
        body,
    )


@pytest.mark.parametrize("path", ROUTES)
@pytest.mark.parametrize("method", METHODS)
def test_every_method_on_every_route_answers_json(path, method):
    client = Client(raise_request_exception=False, enforce_csrf_checks=True)
    response = getattr(client, method)(f"/{path}", HTTP_ACCEPT="text/html")
    assert_json(response, path, method)


@pytest.mark.parametrize("path", ROUTES)
def test_the_slashed_or_unslashed_twin_is_a_json_404(path):
    client = Client(raise_request_exception=False)
    twin = path[:-1] if path.endswith("/") else path + "/"
    for method in ("get", "post", "head"):
        response = getattr(client, method)(f"/{twin}", HTTP_ACCEPT="text/html")
        assert response.status_code == 404, (method, twin, response.status_code)
        assert response["Content-Type"].startswith("application/json")
