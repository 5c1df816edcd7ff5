"""Metrics of jobs: their transitions, the claims refused, how long they wait and run.

Counted by ``job.services`` once the transition's transaction has committed
(``transaction.on_commit``), so a change that rolled back is never counted. Labels are
statuses and refusal codes only: never a job, automation or tenant id.
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from prometheus_client import Counter, Histogram

# From well under a second (a warm worker takes a job in tens of milliseconds) to a day
# (a job pending behind a cold machine, or a long-running command).
_DURATION_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
    4 * 3600.0,
    24 * 3600.0,
)

JOB_TRANSITIONS = Counter(
    "hubdommed_job_transitions_total",
    "Job transitions committed, by the status the job went to "
    "(retried: a job whose worker was lost went back to pending for another attempt).",
    ["to"],
)
JOB_CLAIM_REFUSALS = Counter(
    "hubdommed_job_claim_refusals_total",
    "Claims of a job a worker was refused, by the 409 reason code.",
    ["code"],
)
JOB_TIME_TO_RUNNING = Histogram(
    "hubdommed_job_time_to_running_seconds",
    "Seconds from a job's creation to its claim by a worker (its latest start).",
    buckets=_DURATION_BUCKETS,
)
JOB_TIME_TO_FINISHED = Histogram(
    "hubdommed_job_time_to_finished_seconds",
    "Seconds from a job's creation to its end, by the status it ended in.",
    ["status"],
    buckets=_DURATION_BUCKETS,
)

# The requeue of a job whose worker was lost: back to pending, counted apart.
RETRIED = "retried"


def count_transition_on_commit(
    to: str,
    *,
    created_at: datetime,
    started_at: datetime | None = None,
    finished_at: datetime | None = None,
) -> None:
    """Count one transition to ``to`` when (and only if) the current transaction commits.

    ``started_at`` (on a start) and ``finished_at`` (on an end) feed the histograms of
    the time since ``created_at``.
    """

    def count() -> None:
        JOB_TRANSITIONS.labels(to=to).inc()
        if started_at is not None:
            JOB_TIME_TO_RUNNING.observe(_seconds(started_at - created_at))
        if finished_at is not None:
            JOB_TIME_TO_FINISHED.labels(status=to).observe(_seconds(finished_at - created_at))

    transaction.on_commit(count)


def count_claim_refusal(code: str) -> None:
    """A refused claim changed nothing (its transaction rolled back): counted at once."""
    JOB_CLAIM_REFUSALS.labels(code=code).inc()


def _seconds(delta) -> float:
    return max(0.0, delta.total_seconds())
