"""The scheduler's metrics (``manage.py run_scheduler``)."""

from __future__ import annotations

from prometheus_client import Counter

SCHEDULER_CYCLES = Counter(
    "hubdommed_scheduler_cycles_total",
    "Cycles of the scheduler completed (a cycle the database failed included).",
)
SCHEDULER_RUNS = Counter(
    "hubdommed_scheduler_runs_total",
    "Scheduled runs, by outcome: started (a job created for a due time), stopped (a schedule "
    "paused or ended instead: params no longer valid, automation or tenant deactivated).",
    ["outcome"],
)
SCHEDULER_ERRORS = Counter(
    "hubdommed_scheduler_errors_total",
    "Scheduler cycles that failed, by cause (database unreachable, or a bug).",
    ["cause"],
)
