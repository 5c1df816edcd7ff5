"""The stuck-job monitor's metrics (``manage.py watch_stuck_jobs``).

Beside the job's own metrics, in a file of their own: they count what the monitor did, not
what happened to jobs through the API.
"""

from __future__ import annotations

from prometheus_client import Counter, Gauge

MONITOR_CYCLES = Counter(
    "hubdommed_monitor_cycles_total",
    "Cycles of the stuck-job monitor completed (each step failing alone does not stop one).",
)
# What a cycle did, by action. Each counts the things that action is about:
#   lease_renewed        running jobs given a fresh lease after an outage of the hub
#   power_on_resent      automations whose machine got a power-on again (jobs pending too long)
#   worker_restarted     automations whose silent worker's machine was restarted
#   lost_failed          running jobs whose worker was lost, failed (worker_lost)
#   lost_requeued        ... put back to pending for another attempt
#   lost_canceled        ... ended canceled (a cancellation was pending)
#   lost_alive           ... that heartbeated in time after all
#   lost_error           ... that could not be settled (logged; tried again next cycle)
#   machine_stopped      idle ec2 machines stopped
MONITOR_JOBS = Counter(
    "hubdommed_monitor_jobs_total",
    "What the stuck-job monitor did, by action (jobs, or automations or machines for the "
    "power_on_resent, worker_restarted and machine_stopped actions).",
    ["action"],
)
MONITOR_STEP_ERRORS = Counter(
    "hubdommed_monitor_step_errors_total",
    "Steps of a monitor cycle that failed (database or provider unreachable, or a bug).",
    ["step"],
)
# The checks of common.ways_forward, run each cycle: rows in a non-final state that nothing
# would have moved, by state machine (jobs, task_runs, outbox_messages, ...).
STRANDED_ROWS = Counter(
    "hubdommed_stranded_rows_total",
    "Rows found with no way forward and given one again (re-sent, settled, brought "
    "forward), by state machine. Any increase is a defect or an outage to look into.",
    ["machine"],
)
STRANDED_UNREPAIRED = Gauge(
    "hubdommed_stranded_rows_unrepaired",
    "Rows the last monitor cycle found with no way forward that its check cannot move "
    "itself (an operator must: see the monitor's log), by state machine.",
    ["machine"],
)
OUTPUT_CHUNKS_DELETED = Counter(
    "hubdommed_job_output_chunks_deleted_total",
    "Chunks of finished jobs' logs the monitor deleted, JOB_OUTPUT_RETENTION_DAYS after "
    "their job's end (job.retention).",
)
