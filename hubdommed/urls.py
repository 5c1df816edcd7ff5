from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import (
    SpectacularAPIView,
    SpectacularRedocView,
    SpectacularSwaggerView,
)

from common import health, metrics_endpoint
from common.api import not_found_view
from identity.permissions import IsTenantManagerOrPlatformAdmin
from outbox.api import EventsApi
from outbox.metrics import OutboxBacklogCollector


class SwaggerPage(SpectacularSwaggerView):
    # A page for people: GET only. DRF's OPTIONS answer would go through the HTML renderer,
    # which has no template for it (a 500); refused, it is a JSON 405 like any other.
    http_method_names = ["get", "head"]


class RedocPage(SpectacularRedocView):
    http_method_names = ["get", "head"]


# The apps' admin modules, imported here rather than at start-up (hubdommed.apps): before
# the admin's URLs are built from what they register.
admin.autodiscover()

handler404 = "common.api.not_found_view"
handler500 = "common.api.server_error_view"

api_v1 = [
    path("", include("identity.urls")),
    path("", include("sector.urls")),
    path("", include("automation.urls")),
    path("", include("job.urls")),
    path("", include("schedule.urls")),
    path("", include("webhook.urls")),
    # The outbox's events trail, for the readers identity names (the outbox stands below
    # identity, so the two meet here).
    path(
        "events",
        EventsApi.as_view(permission_classes=[IsTenantManagerOrPlatformAdmin]),
        name="events",
    ),
]

urlpatterns = [
    path("api/v1/", include(api_v1)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SwaggerPage.as_view(url_name="schema"), name="api-docs"),
    path(
        "api/redoc/",
        RedocPage.as_view(url_name="schema", template_name="api/redoc.html"),
        name="api-redoc",
    ),
    path("health/live", health.live, name="health-live"),
    path("health/ready", health.ready, name="health-ready"),
    # Prometheus's: the outbox backlog is measured here too, at each scrape.
    path(
        "metrics",
        metrics_endpoint.metrics,
        {"collectors": [OutboxBacklogCollector()]},
        name="metrics",
    ),
    path("admin/", admin.site.urls),
    # The API's paths are exact: anything else under them is a 404 in the error format, for
    # every method (no redirect to a slashed path, which a POST could not follow), their
    # roots without the slash included.
    re_path(r"^(?:api|health)(?:/|$)", not_found_view),
]
