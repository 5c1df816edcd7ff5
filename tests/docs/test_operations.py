"""docs/OPERATIONS.md keeps up with the settings and the metrics: every variable the
settings read is documented, and the example alert rules parse and name real metrics."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "OPERATIONS.md").read_text()
METRIC = re.compile(r"\bhubdommed_[a-z0-9_]+")
# Suffixes Prometheus adds to a histogram's series.
HISTOGRAM_SERIES = re.compile(r"_(bucket|sum|count)$")


def settings_variables() -> set[str]:
    source = (ROOT / "hubdommed" / "settings.py").read_text()
    read = re.findall(r"\benv\.\w+\(\s*\"([A-Z][A-Z0-9_]*)\"", source)
    read += re.findall(r"_login_rate\(\s*\"([A-Z][A-Z0-9_]*)\"", source)
    return set(read)


def documented_metrics() -> set[str]:
    table = DOC.split("## Metrics", 1)[1].split("```yaml", 1)[0]
    return set(METRIC.findall(table))


def test_every_variable_the_settings_read_is_documented():
    variables = settings_variables()
    assert len(variables) > 50  # the pattern finds them
    missing = sorted(name for name in variables if f"`{name}`" not in DOC)
    assert not missing, missing


# The series the hub exposes (each app's metrics.py; common.metrics for the heartbeat).
EXPOSED = {
    "hubdommed_outbox_pending_messages",
    "hubdommed_outbox_oldest_due_age_seconds",
    "hubdommed_relay_batches_total",
    "hubdommed_relay_messages_sent_total",
    "hubdommed_relay_messages_refused_total",
    "hubdommed_relay_messages_unconfirmed_total",
    "hubdommed_relay_batch_duration_seconds",
    "hubdommed_relay_wakes_total",
    "hubdommed_task_runs_total",
    "hubdommed_task_run_duration_seconds",
    "hubdommed_messages_dead_lettered_total",
    "hubdommed_daemon_heartbeat_timestamp_seconds",
    "hubdommed_job_transitions_total",
    "hubdommed_job_claim_refusals_total",
    "hubdommed_job_time_to_running_seconds",
    "hubdommed_job_time_to_finished_seconds",
    "hubdommed_monitor_cycles_total",
    "hubdommed_monitor_jobs_total",
    "hubdommed_http_requests_total",
    "hubdommed_http_request_duration_seconds",
}


def test_each_metric_is_documented():
    assert documented_metrics() == EXPOSED


def test_the_example_alert_rules_parse_and_name_only_documented_metrics():
    (block,) = re.findall(r"```yaml\n(.*?)```", DOC, flags=re.DOTALL)
    rules = yaml.safe_load(block)
    known = EXPOSED
    alerts = [rule for group in rules["groups"] for rule in group["rules"]]
    assert len(alerts) >= 8
    for group in rules["groups"]:
        assert group["name"] and group["rules"]
    for rule in alerts:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}, rule
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*", rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        if "for" in rule:
            assert re.fullmatch(r"\d+[smh]", rule["for"]), rule["for"]
        named = {HISTOGRAM_SERIES.sub("", name) for name in METRIC.findall(rule["expr"])}
        assert named, rule["expr"]
        assert named <= known, named - known
