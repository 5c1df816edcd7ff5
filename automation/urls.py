from django.urls import path

from automation import api, schema  # noqa: F401  (the credentials in the OpenAPI schema)
from common.urls import member_actions

urlpatterns = [
    path("automations", api.AutomationListCreateApi.as_view(), name="automations"),
    path("automations/<int:automation_id>", api.AutomationDetailApi.as_view(), name="automation"),
    *member_actions(
        "automations/<int:automation_id>",
        "automation",
        {
            "deactivate": api.AutomationDeactivateApi,
            "worker/rotate-credential": api.WorkerRotateCredentialApi,
        },
    ),
    path("worker/me", api.WorkerMeApi.as_view(), name="worker-me"),
]
