"""Input validation and representations of jobs. No business rules here."""

from __future__ import annotations

from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from common.api import AwareDateTimeField, WholeNumberField, check_window
from job.models import FailureReason, Job, JobStatus
from job.selectors import PUBLIC_FIELDS, job_public

# --- people -------------------------------------------------------------------------------


@extend_schema_field({"type": "object", "additionalProperties": True})
class JSONObjectField(serializers.JSONField):
    """A job's parameters: always a JSON object (the database holds nothing else)."""


class JobCreateInput(serializers.Serializer):
    automation = WholeNumberField(min_value=1)
    params = JSONObjectField(
        required=False,
        default=dict,
        help_text="A JSON object; validated against the automation's parameter schema.",
    )

    def validate_params(self, value):
        if not isinstance(value, dict):
            raise serializers.ValidationError("Must be a JSON object.")
        return value


class JobListFilters(serializers.Serializer):
    status = serializers.CharField(
        required=False,
        help_text=f"One status or several, comma-separated: {', '.join(JobStatus.values)}.",
    )
    automation = WholeNumberField(required=False, min_value=1)
    created_after = AwareDateTimeField(
        required=False,
        help_text="Jobs created at or after this instant (ISO 8601 with its offset).",
    )
    created_before = AwareDateTimeField(
        required=False, help_text="Jobs created before this instant (ISO 8601 with its offset)."
    )

    def validate_status(self, value: str) -> list[str]:
        statuses = [part.strip() for part in value.split(",") if part.strip()]
        unknown = sorted(set(statuses) - set(JobStatus.values))
        if unknown or not statuses:
            raise serializers.ValidationError(
                f"Unknown status {', '.join(unknown) or value!r}; "
                f"use {', '.join(JobStatus.values)}."
            )
        return statuses

    def validate(self, attrs):
        check_window(attrs, "created_after", "created_before")
        return attrs

    def as_selector_filters(self) -> dict:
        data = self.validated_data
        return {
            "statuses": data.get("status"),
            "automation_id": data.get("automation"),
            "created_after": data.get("created_after"),
            "created_before": data.get("created_before"),
        }


class BlankAsNullChoiceField(serializers.ChoiceField):
    """A choice the row keeps as "" while there is none, sent as null (a nullable enum)."""

    def __init__(self, **kwargs):
        super().__init__(allow_null=True, read_only=True, **kwargs)

    def to_representation(self, value):
        return None if value in ("", None) else super().to_representation(value)


class JobOutput(serializers.ModelSerializer):
    """The job's public shape as the schema documents it; the body itself is
    ``job.selectors.job_public`` (the webhooks send the same)."""

    automation = serializers.IntegerField(source="automation_id", read_only=True)
    requested_by = serializers.IntegerField(
        source="requested_by_id",
        allow_null=True,
        read_only=True,
        help_text="The id of the person who asked.",
    )
    triggered_by = serializers.JSONField(
        allow_null=True,
        read_only=True,
        help_text=(
            'What started the job when no person asked: {"schedule": id, "due_at": time} '
            "for a schedule's run; null otherwise."
        ),
    )
    rerun_of = serializers.IntegerField(
        source="rerun_of_id",
        allow_null=True,
        read_only=True,
        help_text="The id of the finished job this one runs again (POST /jobs/{id}/rerun); "
        "null otherwise.",
    )
    cancel_requested = serializers.BooleanField(read_only=True)
    result = serializers.JSONField(allow_null=True, read_only=True)
    params = JSONObjectField(read_only=True)
    progress = serializers.JSONField(allow_null=True, read_only=True)
    failure_reason = BlankAsNullChoiceField(
        choices=FailureReason.choices, help_text="Why the job failed; null unless it did."
    )

    class Meta:
        model = Job
        fields = PUBLIC_FIELDS
        read_only_fields = fields

    def to_representation(self, instance: Job) -> dict:
        return job_public(instance)


# --- workers ------------------------------------------------------------------------------


class PollFilters(serializers.Serializer):
    limit = WholeNumberField(required=False, default=20, min_value=1, max_value=100)


class PendingJobOutput(serializers.ModelSerializer):
    class Meta:
        model = Job
        fields = ("id", "created_at", "traceparent", "correlation_id")
        read_only_fields = fields


class ClaimedJobOutput(serializers.ModelSerializer):
    """The job as its worker sees it: what to run and the claim to report with."""

    automation = serializers.IntegerField(source="automation_id", read_only=True)
    params = JSONObjectField(read_only=True)
    cancel_requested = serializers.BooleanField(read_only=True)

    class Meta:
        model = Job
        fields = (
            "id",
            "automation",
            "status",
            "params",
            "attempt",
            "claim_token",
            "lease_expires_at",
            "cancel_requested",
            "started_at",
            "last_heartbeat_at",
            "finished_at",
            "traceparent",
            "correlation_id",
        )
        read_only_fields = fields


class _ClaimInput(serializers.Serializer):
    claim_token = serializers.UUIDField(help_text="The token the claim (start) returned.")


@extend_schema_field({"description": "Any JSON value."})
class AnyJSONField(serializers.JSONField):
    # Text jsonb cannot hold (U+0000, lone surrogates) is refused by the parser already.
    pass


class CommandOutputField(serializers.CharField):
    """Text a command printed: may hold any character, and any length.

    The views that take it list it in ``replace_unstorable_text``, so the parser replaces
    U+0000 and lone surrogates by U+FFFD: a refused report would lose the job's outcome
    (its worker forgets a refused report, and the job would wait for its lease to run out).
    For the same reason, text longer than ``keep_first`` characters is cut to them rather
    than refused.
    """

    def __init__(self, *, keep_first: int | None = None, **kwargs):
        self.keep_first = keep_first
        super().__init__(**kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        return value if self.keep_first is None else value[: self.keep_first]


class StartInput(serializers.Serializer):
    claim_token = serializers.UUIDField(
        required=False,
        help_text=(
            "The worker's own name for this claim (a new UUID per claim). Sent again with "
            "the same token, a claim whose answer was lost is answered with the same claim "
            "(its lease renewed) instead of `already_claimed`. Without it the hub picks one."
        ),
    )


class HeartbeatInput(_ClaimInput):
    progress = AnyJSONField(
        required=False,
        allow_null=True,
        default=None,
        help_text="Optional progress to show people (any JSON; replaces the previous one).",
    )


class HeartbeatOutput(serializers.ModelSerializer):
    cancel_requested = serializers.BooleanField(
        read_only=True,
        help_text="True when someone asked to cancel: stop the command and report fail.",
    )

    class Meta:
        model = Job
        fields = ("id", "status", "cancel_requested", "lease_expires_at", "last_heartbeat_at")
        read_only_fields = fields


def _output_tail_field() -> serializers.CharField:
    return CommandOutputField(
        required=False,
        default="",
        allow_blank=True,
        trim_whitespace=False,
        help_text="The end of the command's output; only the last "
        f"{settings.JOB_OUTPUT_TAIL_MAX_CHARS} characters are kept.",
    )


def _exit_code_field() -> serializers.IntegerField:
    # A process's exit status (negative: killed by that signal), within PostgreSQL's integer.
    return WholeNumberField(
        required=False,
        allow_null=True,
        default=None,
        min_value=-(2**31),
        max_value=2**31 - 1,
        help_text="The command's exit code.",
    )


class CompleteInput(_ClaimInput):
    result = AnyJSONField(
        required=False, allow_null=True, default=None, help_text="Any JSON the command produced."
    )
    output_tail = _output_tail_field()
    exit_code = _exit_code_field()


# The most of a failure's ``error`` a job keeps (its first characters).
FAILURE_ERROR_MAX_CHARS = 10_000


class FailInput(_ClaimInput):
    error = CommandOutputField(
        keep_first=FAILURE_ERROR_MAX_CHARS,
        allow_blank=True,
        trim_whitespace=False,
        help_text=f"What went wrong; only the first {FAILURE_ERROR_MAX_CHARS} characters are kept.",
    )
    output_tail = _output_tail_field()
    exit_code = _exit_code_field()
    reason = serializers.ChoiceField(
        choices=[FailureReason.ERROR, FailureReason.EXIT_CODE, FailureReason.TIMEOUT],
        required=False,
        allow_null=True,
        default=None,
        help_text="Defaults to exit_code when exit_code is non-zero, else error.",
    )


class OutputInput(_ClaimInput):
    seq = WholeNumberField(
        min_value=0, help_text="The chunk's number in the attempt: 0, 1, 2... in order."
    )
    text = CommandOutputField(
        allow_blank=True,
        trim_whitespace=False,
        max_length=settings.JOB_OUTPUT_CHUNK_MAX_CHARS,
        help_text="What the command printed since the previous chunk.",
    )


class OutputAppendedOutput(serializers.Serializer):
    job = serializers.IntegerField(source="chunk.job_id")
    attempt = serializers.IntegerField(source="chunk.attempt")
    seq = serializers.IntegerField(source="chunk.seq")
    offset = serializers.IntegerField(
        source="chunk.offset", help_text="Where the chunk starts in the job's log."
    )
    stored = serializers.BooleanField(
        help_text="False when this chunk was stored before (a retried request)."
    )


# A reader's page of a job's log: by default, and at most.
OUTPUT_PAGE_DEFAULT_CHARS = 64 * 1024
OUTPUT_PAGE_MAX_CHARS = 1024 * 1024
# The furthest offset a reader may ask for: far past any log, and with room below the
# offsets' bigint for the ``next_offset`` an answer adds a page to it.
OUTPUT_OFFSET_MAX = 2**62


class OutputFilters(serializers.Serializer):
    offset = WholeNumberField(
        required=False,
        default=0,
        min_value=0,
        max_value=OUTPUT_OFFSET_MAX,
        help_text="Where to read from: 0, or the `next_offset` of the previous page.",
    )
    limit = WholeNumberField(
        required=False,
        default=OUTPUT_PAGE_DEFAULT_CHARS,
        min_value=1,
        max_value=OUTPUT_PAGE_MAX_CHARS,
        help_text=f"The most characters to answer (default {OUTPUT_PAGE_DEFAULT_CHARS}).",
    )


class FollowFrom(serializers.Serializer):
    offset = WholeNumberField(
        required=False,
        default=0,
        min_value=0,
        max_value=OUTPUT_OFFSET_MAX,
        help_text=(
            "Where to follow from: 0, or a page's `next_offset`. A reconnecting client's "
            "`Last-Event-ID` header takes its place."
        ),
    )


class OutputPageOutput(serializers.Serializer):
    job = serializers.IntegerField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    offset = serializers.IntegerField(help_text="The offset asked for.")
    next_offset = serializers.IntegerField(help_text="The offset to ask for next.")
    dropped_before = serializers.IntegerField(
        help_text=(
            "The log's first stored offset: what came before it was deleted to keep the "
            "log within its limit (0 when nothing was)."
        )
    )
    text = serializers.CharField()
    finished = serializers.BooleanField(
        help_text="The job ended and this page reached the end of its log."
    )
