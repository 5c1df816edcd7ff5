from django.urls import path

from webhook import api

urlpatterns = [
    path("webhooks", api.EndpointsApi.as_view(), name="webhooks"),
    path("webhooks/<int:endpoint_id>", api.EndpointDetailApi.as_view(), name="webhook"),
    path(
        "webhooks/<int:endpoint_id>/rotate-secret",
        api.EndpointRotateSecretApi.as_view(),
        name="webhook-rotate-secret",
    ),
    path(
        "webhooks/<int:endpoint_id>/disable",
        api.EndpointDisableApi.as_view(),
        name="webhook-disable",
    ),
    path(
        "webhooks/<int:endpoint_id>/enable", api.EndpointEnableApi.as_view(), name="webhook-enable"
    ),
    path(
        "webhooks/<int:endpoint_id>/deliveries",
        api.EndpointDeliveriesApi.as_view(),
        name="webhook-deliveries",
    ),
]
