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


def test_the_redoc_page_loads_no_image_from_elsewhere(client: Client):
    page = client.get("/api/redoc/").content.decode()
    # Redoc's bundle asks for one image from its CDN (the footer's logo), whatever the
    # options: the page's policy refuses it (Redoc then leaves the image out).
    policy = re.search(r'<meta http-equiv="Content-Security-Policy" content="([^"]+)">', page)
    assert policy and policy.group(1) == "img-src 'self' data:"
    assert page.index("Content-Security-Policy") < page.index("<script")
    (bundle,) = [src for src in re.findall(r'src="([^"]+)"', page) if "redoc" in src]
    script = b"".join(client.get(bundle).streaming_content).decode()
    assert re.findall(r"https://cdn[^\"' )]*", script) == [
        "https://cdn.redoc.ly/redoc/logo-mini.svg"
    ]
