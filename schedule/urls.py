from django.urls import path

from schedule import api

urlpatterns = [
    path("schedules", api.ScheduleListCreateApi.as_view(), name="schedules"),
    path("schedules/<int:schedule_id>", api.ScheduleDetailApi.as_view(), name="schedule"),
    path(
        "schedules/<int:schedule_id>/pause", api.SchedulePauseApi.as_view(), name="schedule-pause"
    ),
    path(
        "schedules/<int:schedule_id>/resume",
        api.ScheduleResumeApi.as_view(),
        name="schedule-resume",
    ),
    path(
        "schedules/<int:schedule_id>/deactivate",
        api.ScheduleDeactivateApi.as_view(),
        name="schedule-deactivate",
    ),
]
