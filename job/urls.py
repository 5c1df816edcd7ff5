from django.urls import path

from job.api.people import JobCancelApi, JobDetailApi, JobsApi
from job.api.workers import (
    JobCompleteApi,
    JobFailApi,
    JobHeartbeatApi,
    JobStartApi,
    WorkerJobPollApi,
)

urlpatterns = [
    path("jobs", JobsApi.as_view(), name="jobs"),
    path("jobs/<int:job_id>", JobDetailApi.as_view(), name="job-detail"),
    path("jobs/<int:job_id>/cancel", JobCancelApi.as_view(), name="job-cancel"),
    path("jobs/<int:job_id>/start", JobStartApi.as_view(), name="job-start"),
    path("jobs/<int:job_id>/heartbeat", JobHeartbeatApi.as_view(), name="job-heartbeat"),
    path("jobs/<int:job_id>/complete", JobCompleteApi.as_view(), name="job-complete"),
    path("jobs/<int:job_id>/fail", JobFailApi.as_view(), name="job-fail"),
    path("worker/jobs", WorkerJobPollApi.as_view(), name="worker-jobs"),
]
