"""``/metrics`` on the API: every process's metrics in Prometheus's text format.

Open by default, like ``/health/``: the figures carry no tenant's data (labels are route
templates, task names, statuses). Where the API is reachable from outside, set
``METRICS_TOKEN`` and give Prometheus the same value (``authorization: {credentials: …}``
in its scrape config): the endpoint then answers only ``Authorization: Bearer <token>``.
"""

from __future__ import annotations

import hmac
from collections.abc import Iterable

from django.conf import settings
from django.http import HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from prometheus_client.registry import Collector

from common.api import error_body
from common.metrics import exposition


@csrf_exempt
def metrics(request, collectors: Iterable[Collector] = ()) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        response = JsonResponse(error_body("method_not_allowed", "Method Not Allowed."), status=405)
        response["Allow"] = "GET, HEAD"
        return response
    if settings.METRICS_TOKEN and not _token_matches(request, settings.METRICS_TOKEN):
        response = JsonResponse(
            error_body("not_authenticated", "The metrics token is missing or wrong."),
            status=401,
        )
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    body, content_type = exposition(collectors)
    return HttpResponse(body, content_type=content_type)


def _token_matches(request, expected: str) -> bool:
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())
