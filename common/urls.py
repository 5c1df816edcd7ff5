"""URL plumbing shared by every module's ``urls.py``."""

from __future__ import annotations

from django.urls import URLPattern, path
from rest_framework.views import APIView


def member_actions(item: str, name: str, actions: dict[str, type[APIView]]) -> list[URLPattern]:
    """The moves of one resource, ``{item}/{action}``, each named ``{name}-{action}``.

    ``member_actions("sectors/<int:sector_id>", "sector", {"deactivate": SectorDeactivateApi})``
    is ``POST /sectors/{id}/deactivate``, named ``sector-deactivate``; an action with a
    slash (``worker/rotate-credential``) is named with a dash in its place.
    """
    return [
        path(f"{item}/{action}", view.as_view(), name=f"{name}-{action.replace('/', '-')}")
        for action, view in actions.items()
    ]


def resource(
    collection: str,
    member_id: str,
    name: str,
    *,
    listing: type[APIView],
    member: type[APIView],
    actions: dict[str, type[APIView]] | None = None,
) -> list[URLPattern]:
    """A resource's routes: ``{collection}`` (named ``{collection}``), one of its members,
    ``{collection}/<int:{member_id}>`` (named ``{name}``), and the member's moves
    (``member_actions``)."""
    item = f"{collection}/<int:{member_id}>"
    return [
        path(collection, listing.as_view(), name=collection),
        path(item, member.as_view(), name=name),
        *member_actions(item, name, actions or {}),
    ]
