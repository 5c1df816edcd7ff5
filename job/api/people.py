"""The jobs API for people of a tenant: trigger, list, read, cancel, re-run."""

from __future__ import annotations

from django.core.handlers.asgi import ASGIRequest
from django.db import connection
from django.http import HttpResponse, StreamingHttpResponse
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import status
from rest_framework.exceptions import Throttled
from rest_framework.generics import GenericAPIView
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from common.api import NewestFirstCursorPagination, query_values, validated, validated_query
from common.errors import InvalidInput, NotFound
from common.schema import error_response
from identity.permissions import IsTenantMember
from job import live
from job.api.serializers import (
    FollowFrom,
    JobCreateInput,
    JobListFilters,
    JobOutput,
    OutputFilters,
    OutputPageOutput,
)
from job.selectors import job_get, job_list, job_output_page, job_public, output_page_public
from job.services import job_cancel, job_create, job_rerun

IDEMPOTENCY_HEADER = "Idempotency-Key"
# When a follower refused for the stream process's bounds is told to come back.
STREAMS_FULL_RETRY_SECONDS = 5
IDEMPOTENCY_KEY_MAX_LENGTH = 255


def idempotency_key_of(request) -> str | None:
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not key or len(key) > IDEMPOTENCY_KEY_MAX_LENGTH or not key.isprintable():
        raise InvalidInput(
            f"The {IDEMPOTENCY_HEADER} header must be 1 to {IDEMPOTENCY_KEY_MAX_LENGTH} "
            "printable characters.",
            code="invalid_idempotency_key",
        )
    return key


def _idempotency_parameter() -> OpenApiParameter:
    return OpenApiParameter(
        IDEMPOTENCY_HEADER,
        str,
        OpenApiParameter.HEADER,
        required=False,
        description="Any string up to 255 characters, unique per request you mean.",
    )


# What ``_created`` answers, in the schema of the operations that create a job.
_CREATED_RESPONSES = {
    201: JobOutput,
    200: OpenApiResponse(JobOutput, description="A repeated request: the same job."),
}


def _created(job, created: bool) -> Response:
    """The new job (201), or the one a repeated request created (200)."""
    return Response(
        job_public(job), status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
    )


class JobsApi(GenericAPIView):
    """``/jobs``: the list (GET) and the trigger (POST) share the path."""

    permission_classes = [IsTenantMember]
    pagination_class = NewestFirstCursorPagination
    serializer_class = JobOutput

    @extend_schema(
        operation_id="jobs_list",
        summary="The tenant's jobs, newest first",
        parameters=[JobListFilters],
        responses={200: JobOutput(many=True), 400: error_response("A bad filter (`invalid`).")},
    )
    def get(self, request):
        filters = JobListFilters(data=query_values(request))
        filters.is_valid(raise_exception=True)
        jobs = job_list(tenant=request.user.tenant_id, **filters.as_selector_filters())
        page = self.paginate_queryset(jobs)
        return self.get_paginated_response([job_public(job) for job in page])

    @extend_schema(
        operation_id="jobs_create",
        summary="Trigger a job",
        description=(
            "Creates the job `pending` and records `JobCreated` in the same transaction. "
            f"With an `{IDEMPOTENCY_HEADER}` header, repeating the request returns the job "
            "it created (200) instead of creating another."
        ),
        parameters=[_idempotency_parameter()],
        request=JobCreateInput,
        responses={
            **_CREATED_RESPONSES,
            400: error_response(
                "`invalid`, `unknown_automation`, `invalid_params`, `params_too_large`, "
                "`invalid_idempotency_key`."
            ),
            409: error_response(
                "`automation_inactive`, `automation_misconfigured` (its parameter schema is "
                "broken), `idempotency_key_reused`."
            ),
        },
    )
    def post(self, request):
        data = validated(JobCreateInput, request.data)
        job, created = job_create(
            tenant=request.user.tenant,
            automation_id=data["automation"],
            params=data["params"],
            requested_by=request.user,
            idempotency_key=idempotency_key_of(request),
        )
        return _created(job, created)


class JobDetailApi(APIView):
    permission_classes = [IsTenantMember]

    @extend_schema(
        operation_id="jobs_retrieve",
        summary="One of the tenant's jobs",
        responses={
            200: JobOutput,
            404: error_response("`job_not_found` (also another tenant's job)."),
        },
    )
    def get(self, request, job_id: int):
        job = job_get(tenant=request.user.tenant_id, job_id=job_id)
        if job is None:
            raise NotFound("There is no such job.", code="job_not_found")
        return Response(job_public(job))


class OutputTextRenderer(BaseRenderer):
    """A page of a job's log as plain text (``Accept: text/plain`` or ``?format=text``):
    its text, after a line saying how much was deleted before it when some was."""

    media_type = "text/plain"
    format = "text"
    charset = "utf-8"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        dropped = max(0, data["dropped_before"] - data["offset"])
        marker = f"[... {dropped} characters dropped ...]\n" if dropped else ""
        return (marker + data["text"]).encode(self.charset)


class OutputPageResponse(Response):
    """An empty page of text is still text/plain: DRF drops the Content-Type of an empty
    body, and a client could not tell an empty page from a broken answer."""

    @property
    def rendered_content(self):
        content = super().rendered_content
        if not content and "Content-Type" not in self:
            renderer = self.accepted_renderer
            self["Content-Type"] = f"{renderer.media_type}; charset={renderer.charset}"
        return content


class JobOutputReadApi(APIView):
    permission_classes = [IsTenantMember]
    renderer_classes = [JSONRenderer, OutputTextRenderer]

    @extend_schema(
        operation_id="jobs_output",
        summary="A page of a job's output, as its worker sent it",
        description=(
            "Read from `offset` 0, then from each page's `next_offset`, until `finished`. "
            "A long log keeps its last characters only: `dropped_before` is its first "
            "stored offset, and a page asked for before it starts there. Offsets never "
            "change. With `Accept: text/plain` (or `?format=text`), the page's text alone, "
            "after a line `[... N characters dropped ...]` when some were."
        ),
        parameters=[OutputFilters],
        responses={
            (200, "application/json"): OutputPageOutput,
            (200, "text/plain"): OpenApiResponse(str, description="The page's text."),
            400: error_response("A bad `offset` or `limit` (`invalid`)."),
            404: error_response("`job_not_found` (also another tenant's job)."),
        },
    )
    def get(self, request, job_id: int):
        filters = validated_query(OutputFilters, request)
        job = job_get(tenant=request.user.tenant_id, job_id=job_id)
        if job is None:
            raise NotFound("There is no such job.", code="job_not_found")
        page = job_output_page(job=job, offset=filters["offset"], limit=filters["limit"])
        return OutputPageResponse(OutputPageOutput(output_page_public(job, page)).data)


class IgnoreAccept(DefaultContentNegotiation):
    """Whatever the client accepts (an EventSource asks for ``text/event-stream``), an
    error is JSON in the one format, and a stream is a stream."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


class JobOutputFollowApi(APIView):
    permission_classes = [IsTenantMember]
    renderer_classes = [JSONRenderer]
    content_negotiation_class = IgnoreAccept

    @extend_schema(
        operation_id="jobs_output_follow",
        summary="Follow a job's output live (Server-Sent Events)",
        description=(
            "`text/event-stream`: an `output` event for each piece of the log after "
            "`offset`, as the worker sends it, its data JSON (`offset`, `next_offset`, "
            "`text`, and `dropped` when characters before it were deleted), its id its "
            "`next_offset`; then `end` (data: the job's `status`) when the job has "
            "finished and its log was sent. A reconnecting client sends the last id it got "
            "as `Last-Event-ID` and gets each character once. A finished job followed from "
            "its log's end answers 204, which tells an EventSource to stop. Served live by "
            "the stream process (`hubdommed.asgi`); the API process answers the same "
            "request with the log as it is now and `retry: 1000`, so a client there asks "
            "again each second (see docs/api.md). A stream lasts no longer than the access "
            "token it was opened with, and ends soon after its reader may no longer log in."
        ),
        parameters=[
            FollowFrom,
            OpenApiParameter(
                "Last-Event-ID",
                location=OpenApiParameter.HEADER,
                required=False,
                description="The last event id received: where a reconnection resumes.",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(str, description="The events."),
            204: OpenApiResponse(description="The job has finished and nothing follows."),
            400: error_response("A bad `offset` or `Last-Event-ID` (`invalid`)."),
            404: error_response("`job_not_found` (also another tenant's job)."),
            429: error_response(
                "`throttled`: the stream process holds as many streams as it may, in all "
                "or for the tenant; come back after `Retry-After` seconds."
            ),
        },
    )
    def get(self, request, job_id: int):
        last_event_id = request.headers.get("Last-Event-ID")
        if last_event_id is not None:
            offset = validated(FollowFrom, {"offset": last_event_id})["offset"]
        else:
            offset = validated_query(FollowFrom, request)["offset"]
        job = job_get(tenant=request.user.tenant_id, job_id=job_id)
        if job is None:
            raise NotFound("There is no such job.", code="job_not_found")
        if live.at_end(job, offset):
            return HttpResponse(status=status.HTTP_204_NO_CONTENT)
        if request.method == "HEAD":
            # No body to send: the stream's headers, without following it (the stream
            # process would follow it for its whole time, holding the connection).
            return _event_stream(HttpResponse(content_type="text/event-stream"))
        if isinstance(request._request, ASGIRequest):
            reader = live.Reader(
                user_id=request.user.pk,
                tenant_id=request.user.tenant_id,
                token_expires_at=request.auth["exp"],
            )
            events = live.follow_for(reader, job.pk, offset)
            if events is None:
                raise Throttled(
                    wait=STREAMS_FULL_RETRY_SECONDS,
                    detail="Too many streams are open; try again shortly.",
                )
            # The stream outlives the request's thread: its database connection is not
            # held for the stream's life (the reads have connections of their own).
            connection.close()
        else:
            events = live.events_now(job, offset)
        return _event_stream(StreamingHttpResponse(events, content_type="text/event-stream"))


def _event_stream(response: HttpResponse | StreamingHttpResponse):
    response["Cache-Control"] = "no-cache"
    # A proxy that buffers (nginx) would hold the events back.
    response["X-Accel-Buffering"] = "no"
    return response


class JobCancelApi(APIView):
    permission_classes = [IsTenantMember]

    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description=(
            "A pending job is canceled at once. A running job is marked: its worker learns "
            "it at the next heartbeat, stops and reports, and the job ends `canceled`. "
            "Asking again changes nothing."
        ),
        request=None,
        responses={
            200: JobOutput,
            404: error_response("`job_not_found`."),
            409: error_response("`already_finished`."),
        },
    )
    def post(self, request, job_id: int):
        job = job_cancel(tenant=request.user.tenant_id, job_id=job_id, actor=request.user)
        return Response(job_public(job))


class JobRerunApi(APIView):
    # As POST /jobs: whoever may trigger a job may run one again.
    permission_classes = [IsTenantMember]

    @extend_schema(
        operation_id="jobs_rerun",
        summary="Run a finished job again",
        description=(
            "Creates a new job `pending` of the finished job's automation with its params, "
            "`rerun_of` naming it, exactly as `POST /jobs` would create it: checked against "
            "the automation as it is now (active, its parameter schema of today), with "
            f"`JobCreated` recorded in the same transaction. With an `{IDEMPOTENCY_HEADER}` "
            "header, repeating the request returns the job it created (200)."
        ),
        parameters=[_idempotency_parameter()],
        request=None,
        responses={
            **_CREATED_RESPONSES,
            400: error_response(
                "`invalid_params`, `params_too_large` (the params against the automation's "
                "schema of today), `invalid_idempotency_key`."
            ),
            404: error_response("`job_not_found` (also another tenant's job)."),
            409: error_response(
                "`job_not_finished` (pending or running), `automation_inactive`, "
                "`automation_misconfigured` (its parameter schema is broken), "
                "`idempotency_key_reused`, `tenant_inactive` (the caller's tenant deactivated "
                "while the request ran)."
            ),
        },
    )
    def post(self, request, job_id: int):
        job, created = job_rerun(
            tenant=request.user.tenant,
            job_id=job_id,
            requested_by=request.user,
            idempotency_key=idempotency_key_of(request),
        )
        return _created(job, created)
