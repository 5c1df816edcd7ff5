from django.urls import path

from common.urls import member_actions
from schedule import api

urlpatterns = [
    path("schedules", api.ScheduleListCreateApi.as_view(), name="schedules"),
    path("schedules/<int:schedule_id>", api.ScheduleDetailApi.as_view(), name="schedule"),
    *member_actions(
        "schedules/<int:schedule_id>",
        "schedule",
        {
            "pause": api.SchedulePauseApi,
            "resume": api.ScheduleResumeApi,
            "deactivate": api.ScheduleDeactivateApi,
        },
    ),
]
