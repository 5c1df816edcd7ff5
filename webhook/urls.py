from common.urls import resource
from webhook import api

urlpatterns = resource(
    "webhooks",
    "endpoint_id",
    "webhook",
    listing=api.EndpointsApi,
    member=api.EndpointDetailApi,
    actions={
        "rotate-secret": api.EndpointRotateSecretApi,
        "disable": api.EndpointDisableApi,
        "enable": api.EndpointEnableApi,
        "deliveries": api.EndpointDeliveriesApi,
    },
)
