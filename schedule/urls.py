from common.urls import resource
from schedule import api

urlpatterns = resource(
    "schedules",
    "schedule_id",
    "schedule",
    listing=api.ScheduleListCreateApi,
    member=api.ScheduleDetailApi,
    actions={
        "pause": api.SchedulePauseApi,
        "resume": api.ScheduleResumeApi,
        "deactivate": api.ScheduleDeactivateApi,
    },
)
