"""The jobs API for an automation's worker: poll, claim, heartbeat, report.

Authenticated by the worker's own credential only, and limited to the worker's
automation: another automation's job is a 404, as if it did not exist.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from automation.authentication import WorkerAuthentication
from automation.permissions import IsWorker
from automation.services import worker_seen
from common import tracing
from common.api import validated, validated_query
from common.context import bind_log_ids
from common.errors import Conflict
from common.middleware import log_quietly
from common.schema import change_schema, error_response
from job.api.serializers import (
    ClaimedJobOutput,
    CompleteInput,
    FailInput,
    HeartbeatInput,
    HeartbeatOutput,
    OutputAppendedOutput,
    OutputInput,
    PendingJobOutput,
    PollFilters,
    StartInput,
)
from job.selectors import jobs_pending_for
from job.services import (
    job_claim,
    job_complete,
    job_fail,
    job_heartbeat,
    job_output_append,
)

if TYPE_CHECKING:
    from automation.models import Worker
    from job.models import Job

_NOT_FOUND = error_response("`job_not_found` (also another automation's job).")
_REPORT_CONFLICTS = error_response(
    (
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
        filters = validated_query(PollFilters, request)
        jobs = jobs_pending_for(automation_id=request.user.automation_id, limit=filters["limit"])
        # An idle worker's poll is how the hub knows it is alive (the monitor restarts
        # a worker silent while jobs wait).
        worker_seen(worker_id=request.user.pk)
        response = Response(PendingJobOutput(jobs, many=True).data)
        # Every few seconds per idle machine: logged at debug when there was nothing to take.
        return response if jobs else log_quietly(response)


class JobStartApi(WorkerApi):
    @change_schema(
        ClaimedJobOutput,
        request=StartInput,
        invalid="`validation_error`: a claim_token that is no UUID.",
        not_found=_NOT_FOUND,
        conflicts="An expected refusal: `already_claimed`, `concurrency_limit` or `not_pending`.",
        operation_id="jobs_start",
        # The worker's side of a job: with its poll, apart from what people call.
        tags=["worker"],
        summary="Claim a pending job",
        description=(
            "Succeeds only when the job is pending and the automation runs fewer jobs than "
            "its limit. The answer carries the claim token to heartbeat and report with and "
            "the lease's expiry: heartbeat well before it (every third of the lease). A "
            "worker that names its claim (`claim_token`) may send it again when the answer "
            "is lost: the same claim is answered again."
        ),
    )
    def post(self, request, job_id: int):
        data = validated(StartInput, request.data)
        job = job_claim(worker=request.user, job_id=job_id, claim_token=data.get("claim_token"))
        return _answer(ClaimedJobOutput, job)

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(exc, Conflict):
            # A refused claim is normal traffic, already logged at info by job_claim (with
            # its code): keep django.request from logging each one again as a warning, and
            # its request line (a 409) at debug.
            response._has_been_logged = True
            log_quietly(response)
        return response


class _JobReportApi(WorkerApi):
    # A worker's report on the job it holds, as _ScheduleMoveApi moves a schedule:
    # ``report_input`` checks the body, ``report`` is the one service call, ``answer``
    # serializes the job. Each report documents its operation with ``_report_schema``.
    report_input: type[serializers.Serializer]
    answer: type[serializers.Serializer]

    @staticmethod
    def report(*, worker: Worker, job_id: int, **data: Any) -> Job:
        raise NotImplementedError

    def post(self, request, job_id: int):
        data = validated(self.report_input, request.data)
        job = self.report(worker=request.user, job_id=job_id, **data)
        return _answer(self.answer, job)


def _report_schema(answer, *, request, operation_id: str, summary: str, description: str):
    """A report's operation: refused as every report is (another automation's job, a stale
    claim), on the worker's side of the API."""
    return extend_schema_view(
        post=change_schema(
            answer,
            request=request,
            not_found=_NOT_FOUND,
            conflicts=_REPORT_CONFLICTS,
            operation_id=operation_id,
            tags=["worker"],
            summary=summary,
            description=description,
        )
    )


@_report_schema(
    HeartbeatOutput,
    request=HeartbeatInput,
    operation_id="jobs_heartbeat",
    summary="Extend the claim's lease",
    description=(
        "The answer's `cancel_requested` tells the worker to stop and report. Once a "
        "cancellation is asked, beats extend the lease to two leases after it at most: a job "
        "whose worker has not reported by then is ended `canceled`. Past the automation's "
        "`timeout_seconds`, beats extend it to a lease after the limit at most, and then the "
        "job is failed `timeout`."
    ),
)
class JobHeartbeatApi(_JobReportApi):
    report_input = HeartbeatInput
    report = staticmethod(job_heartbeat)
    answer = HeartbeatOutput


@_report_schema(
    ClaimedJobOutput,
    request=CompleteInput,
    operation_id="jobs_complete",
    summary="Report success",
    description=(
        "Ends the job `succeeded` with its `result` and, optionally, the command's "
        "`exit_code` and the end of its output (`output_tail`). Repeating the same "
        "report returns the job unchanged."
    ),
)
class JobCompleteApi(_JobReportApi):
    # A command's output may hold any character: what text cannot store is replaced.
    replace_unstorable_text = ("output_tail",)
    report_input = CompleteInput
    report = staticmethod(job_complete)
    answer = ClaimedJobOutput


@_report_schema(
    ClaimedJobOutput,
    request=FailInput,
    operation_id="jobs_fail",
    summary="Report failure",
    description=(
        "Ends the job `failed`, or `canceled` when a cancellation was requested. "
        "Repeating the same report returns the job unchanged."
    ),
)
class JobFailApi(_JobReportApi):
    # A command's output may hold any character: what text cannot store is replaced.
    replace_unstorable_text = ("output_tail", "error")
    report_input = FailInput
    report = staticmethod(job_fail)
    answer = ClaimedJobOutput


class JobOutputAppendApi(WorkerApi):
    # A command's output may hold any character: what text cannot store is replaced.
    replace_unstorable_text = ("text",)

    @change_schema(
        OutputAppendedOutput,
        request=OutputInput,
        not_found=_NOT_FOUND,
        conflicts=error_response(
            "`stale_claim`, `already_finished`, `not_running` (as a heartbeat's), "
            "`output_out_of_order` (not the attempt's next chunk: `details.expected_seq`), "
            "`output_seq_taken` (a chunk stored under this `seq` holds other text: "
            "`details.seq`, `details.expected_seq`). Nothing is stored."
        ),
        operation_id="jobs_output_append",
        tags=["worker"],
        summary="Send a chunk of the running command's output",
        description=(
            "Chunks are numbered per attempt (`seq` 0, 1, 2...) and sent in order. Sending "
            "a chunk again (a retry, the same text) is a 200 with `stored` false that "
            "stores nothing."
        ),
    )
    def post(self, request, job_id: int):
        data = validated(OutputInput, request.data)
        appended = job_output_append(worker=request.user, job_id=job_id, **data)
        # Every half second of a chatty command: its request line is logged at debug.
        return log_quietly(Response(OutputAppendedOutput(appended).data))
