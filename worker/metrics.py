"""The worker's metrics (module-level, in the process's registry: see ``common.metrics``)."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

TASK_RUNS = Counter(
    "hubdommed_task_runs_total",
    "Deliveries of task messages settled by the worker, by task and outcome "
    "(succeeded, retried, failed, dead_lettered, timed_out, duplicate).",
    ["task", "outcome"],
)
TASK_RUN_DURATION = Histogram(
    "hubdommed_task_run_duration_seconds",
    "Time spent in a task's handler.",
    ["task"],
    buckets=(0.001, 0.005, 0.025, 0.1, 0.5, 1, 2.5, 10, 30, 60, 300, 900),
)
DEAD_LETTERED = Counter(
    "hubdommed_messages_dead_lettered_total",
    "Messages the worker parked in their queue's dead-letter queue.",
    ["queue"],
)
