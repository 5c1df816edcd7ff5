from django.urls import path

from automation import api, schema  # noqa: F401  (the credentials in the OpenAPI schema)
from common.urls import resource

urlpatterns = [
    *resource(
        "automations",
        "automation_id",
        "automation",
        listing=api.AutomationListCreateApi,
        member=api.AutomationDetailApi,
        actions={
            "deactivate": api.AutomationDeactivateApi,
            "worker/rotate-credential": api.WorkerRotateCredentialApi,
        },
    ),
    path("worker/me", api.WorkerMeApi.as_view(), name="worker-me"),
]
