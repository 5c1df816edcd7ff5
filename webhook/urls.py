from django.urls import path

from common.urls import member_actions
from webhook import api

urlpatterns = [
    path("webhooks", api.EndpointsApi.as_view(), name="webhooks"),
    path("webhooks/<int:endpoint_id>", api.EndpointDetailApi.as_view(), name="webhook"),
    *member_actions(
        "webhooks/<int:endpoint_id>",
        "webhook",
        {
            "rotate-secret": api.EndpointRotateSecretApi,
            "disable": api.EndpointDisableApi,
            "enable": api.EndpointEnableApi,
            "deliveries": api.EndpointDeliveriesApi,
        },
    ),
]
