from django.urls import path

from automation import api

urlpatterns = [
    path("automations", api.AutomationListCreateApi.as_view(), name="automations"),
    path("automations/<int:automation_id>", api.AutomationDetailApi.as_view(), name="automation"),
    path(
        "automations/<int:automation_id>/deactivate",
        api.AutomationDeactivateApi.as_view(),
        name="automation-deactivate",
    ),
    path(
        "automations/<int:automation_id>/worker/rotate-credential",
        api.WorkerRotateCredentialApi.as_view(),
        name="automation-worker-rotate-credential",
    ),
    path("worker/me", api.WorkerMeApi.as_view(), name="worker-me"),
]
