"""The jobs API for an automation's worker: poll, claim, heartbeat, report.

Authenticated by the worker's own credential only, and limited to the worker's
automation: another automation's job is a 404, as if it did not exist.
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from automation.authentication import WorkerAuthentication
from automation.permissions import IsWorker
from automation.services import worker_seen
from common import tracing
from common.api import validated
from common.context import bind_log_ids
from common.errors import Conflict
from common.schema import ErrorSerializer
from job.api.serializers import (
    ClaimedJobOutput,
    CompleteInput,
    FailInput,
    HeartbeatInput,
    HeartbeatOutput,
    PendingJobOutput,
    PollFilters,
)
from job.selectors import jobs_pending_for
from job.services import job_claim, job_complete, job_fail, job_heartbeat

_NOT_FOUND = OpenApiResponse(
    ErrorSerializer, description="`job_not_found` (also another automation's job)."
)
_REPORT_CONFLICTS = OpenApiResponse(
    ErrorSerializer,
    description=(
        "`stale_claim` (not the job's current claim), `already_finished` (the job ended "
        "otherwise), `not_running`. Nothing changes."
    ),
)


class WorkerApi(APIView):
    authentication_classes = [WorkerAuthentication]
    permission_classes = [IsWorker]

    def initial(self, request, *args, **kwargs):
        # The request's log lines and span name the job (the worker sends the job's own
        # correlation id and trace with its requests: automation.agent.client).
        job_id = kwargs.get("job_id")
        if job_id is not None:
            bind_log_ids(job_id=job_id)
            tracing.annotate(job_id=job_id)
        super().initial(request, *args, **kwargs)


def _answer(serializer, job) -> Response:
    """The job, with its tenant bound to the request's remaining log lines and span."""
    bind_log_ids(tenant_id=job.tenant_id)
    tracing.annotate(tenant_id=job.tenant_id, job_status=str(job.status))
    return Response(serializer(job).data)


class WorkerJobPollApi(WorkerApi):
    @extend_schema(
        operation_id="worker_jobs_pending",
        summary="The worker's poll: its automation's pending jobs, oldest first",
        parameters=[PollFilters],
        responses={200: PendingJobOutput(many=True)},
    )
    def get(self, request):
        filters = validated(PollFilters, request.query_params)
        jobs = jobs_pending_for(automation_id=request.user.automation_id, limit=filters["limit"])
        # An idle worker's poll is how the hub knows it is alive (the monitor restarts
        # a worker silent while jobs wait).
        worker_seen(worker_id=request.user.pk)
        return Response(PendingJobOutput(jobs, many=True).data)


class JobStartApi(WorkerApi):
    @extend_schema(
        operation_id="jobs_start",
        summary="Claim a pending job",
        description=(
            "Succeeds only when the job is pending and the automation runs fewer jobs than "
            "its limit. The answer carries the claim token to heartbeat and report with and "
            "the lease's expiry: heartbeat well before it (every third of the lease)."
        ),
        request=None,
        responses={
            200: ClaimedJobOutput,
            404: _NOT_FOUND,
            409: OpenApiResponse(
                ErrorSerializer,
                description=(
                    "An expected refusal: `already_claimed`, `concurrency_limit` or `not_pending`."
                ),
            ),
        },
    )
    def post(self, request, job_id: int):
        job = job_claim(worker=request.user, job_id=job_id)
        return _answer(ClaimedJobOutput, job)

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(exc, Conflict):
            # A refused claim is normal traffic, already logged at info by job_claim;
            # keep django.request from logging each one again as a warning.
            response._has_been_logged = True
        return response


class JobHeartbeatApi(WorkerApi):
    @extend_schema(
        operation_id="jobs_heartbeat",
        summary="Extend the claim's lease",
        description="The answer's `cancel_requested` tells the worker to stop and report.",
        request=HeartbeatInput,
        responses={200: HeartbeatOutput, 404: _NOT_FOUND, 409: _REPORT_CONFLICTS},
    )
    def post(self, request, job_id: int):
        data = validated(HeartbeatInput, request.data)
        job = job_heartbeat(worker=request.user, job_id=job_id, **data)
        return _answer(HeartbeatOutput, job)


class JobCompleteApi(WorkerApi):
    # A command's output may hold any character: what text cannot store is replaced.
    replace_unstorable_text = ("output_tail",)

    @extend_schema(
        operation_id="jobs_complete",
        summary="Report success",
        description=(
            "Ends the job `succeeded` with its `result` and, optionally, the command's "
            "`exit_code` and the end of its output (`output_tail`). Repeating the same "
            "report returns the job unchanged."
        ),
        request=CompleteInput,
        responses={200: ClaimedJobOutput, 404: _NOT_FOUND, 409: _REPORT_CONFLICTS},
    )
    def post(self, request, job_id: int):
        data = validated(CompleteInput, request.data)
        job = job_complete(worker=request.user, job_id=job_id, **data)
        return _answer(ClaimedJobOutput, job)


class JobFailApi(WorkerApi):
    # A command's output may hold any character: what text cannot store is replaced.
    replace_unstorable_text = ("output_tail", "error")

    @extend_schema(
        operation_id="jobs_fail",
        summary="Report failure",
        description=(
            "Ends the job `failed`, or `canceled` when a cancellation was requested. "
            "Repeating the same report returns the job unchanged."
        ),
        request=FailInput,
        responses={200: ClaimedJobOutput, 404: _NOT_FOUND, 409: _REPORT_CONFLICTS},
    )
    def post(self, request, job_id: int):
        data = validated(FailInput, request.data)
        job = job_fail(worker=request.user, job_id=job_id, **data)
        return _answer(ClaimedJobOutput, job)
