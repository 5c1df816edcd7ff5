"""The API's content negotiation (``DEFAULT_CONTENT_NEGOTIATION_CLASS``).

A module of its own: DRF imports it while defining ``APIView``, so it must not import
``rest_framework.views`` (as ``common.api`` does) or the import goes round in a circle.
"""

from __future__ import annotations

from django.http import Http404
from rest_framework import exceptions
from rest_framework.negotiation import DefaultContentNegotiation


class JSONFallbackNegotiation(DefaultContentNegotiation):
    """Honours ``Accept`` among the formats a view offers, and answers JSON when it names
    none of them (``text/html``, ``application/xml``) rather than a 406.

    HTTP lets a server disregard ``Accept``; a JSON answer is what every client of this
    API can read, and a browser asking for HTML gets something to look at.
    """

    def select_renderer(self, request, renderers, format_suffix=None):
        try:
            return super().select_renderer(request, renderers, format_suffix)
        except (exceptions.NotAcceptable, Http404):
            # Http404: a ``?format=`` the view does not offer.
            renderer = next((r for r in renderers if r.format == "json"), renderers[0])
            return renderer, renderer.media_type
