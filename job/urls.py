from django.urls import path

from common.urls import member_actions
from job.api.output import JobOutputApi
from job.api.people import (
    JobCancelApi,
    JobDetailApi,
    JobOutputFollowApi,
    JobRerunApi,
    JobsApi,
)
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
    *member_actions(
        "jobs/<int:job_id>",
        "job",
        {
            "cancel": JobCancelApi,
            "rerun": JobRerunApi,
            "start": JobStartApi,
            "heartbeat": JobHeartbeatApi,
            "complete": JobCompleteApi,
            "fail": JobFailApi,
            "output": JobOutputApi,
            "output/stream": JobOutputFollowApi,
        },
    ),
    path("worker/jobs", WorkerJobPollApi.as_view(), name="worker-jobs"),
]
