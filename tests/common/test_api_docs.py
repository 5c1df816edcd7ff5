"""The interactive API docs are served by the API itself: no script, style or font from
another host (a machine without internet gets working pages)."""

from __future__ import annotations

import re

import pytest
from django.test import Client

# Any absolute URL (or protocol-relative one) in an attribute or a script.
EXTERNAL = re.compile(
    r"""(?:src|href)\s*=\s*["'](?:https?:)?//|["'](?:https?:)?//[a-z0-9.-]+\.[a-z]{2,}"""
)


@pytest.mark.parametrize("path", ["/api/docs/", "/api/redoc/"])
def test_the_docs_pages_reference_no_external_host(client: Client, path):
    response = client.get(path)

    assert response.status_code == 200
    page = response.content.decode()
    assert not EXTERNAL.search(page), EXTERNAL.search(page)
    # And what they load is served here.
    assets = re.findall(r"""(?:src|href)=["']([^"']+)["']""", page)
    assert assets, page
    for asset in assets:
        if asset.startswith("/static/"):
            assert client.get(asset).status_code == 200, asset
