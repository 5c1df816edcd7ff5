"""What an operator sees of one job run end to end: the metrics of the API and of each
daemon's port, and log lines of every process that share the creating request's id.

All real: the API over HTTP (the live server, in this process), ``run_relay``,
``run_worker`` and ``watch_stuck_jobs`` as processes with their metrics ports, the local
machine provider and the automation worker it starts.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from pathlib import Path

import pytest
import requests

from tests.e2e.conftest import job_status
from tests.observability.conftest import samples
from tests.polling import wait_until
from tests.ports import free_port

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


class Daemon:
    """A daemon started with its metrics port and JSON logs at debug."""

    def __init__(self, system, name: str, *args: str, **env: object) -> None:
        self.name = name
        self.port = free_port()
        self.log = Path(system.logs) / f"{name}.log"
        self.process = system.start(
            name, *args, METRICS_PORT=self.port, LOG_FORMAT="json", LOG_LEVEL="debug", **env
        )

    def scrape(self) -> str:
        return requests.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5).text

    def serving(self) -> bool:
        with contextlib.suppress(requests.ConnectionError):
            return bool(self.scrape())
        return False

    def json_lines(self) -> list[dict]:
        lines = []
        for raw in self.log.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                line = json.loads(raw)
                if isinstance(line, dict):
                    lines.append(line)
        return lines


def post_job(api, automation_id: int, request_id: str) -> int:
    response = api.post(
        f"{api.base}/jobs",
        json={"automation": automation_id, "params": {"name": "Ada"}},
        headers={"X-Request-ID": request_id},
    )
    assert response.status_code == 201, response.text
    assert response.headers["X-Request-ID"] == request_id
    return response.json()["id"]


@pytest.fixture
def one_job_run(system, catalog, api):
    """The daemons, and one job from POST /api/v1/jobs to succeeded."""
    automation = catalog("observed").automation
    relay = Daemon(system, "relay", "run_relay", HUBDOMMED_RELAY="true")
    worker = Daemon(
        system, "worker", "run_worker", "--queues", "critical,default", "--concurrency", "2"
    )
    monitor = Daemon(system, "monitor", "watch_stuck_jobs", MONITOR_INTERVAL_SECONDS="0.5")
    for daemon in (relay, worker, monitor):
        wait_until(daemon.serving, timeout=60, message=system.log_text)

    request_id = f"e2e-{uuid.uuid4().hex}"
    job_id = post_job(api, automation.id, request_id)
    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=90,
        message=lambda: f"job is {job_status(job_id)}\n{system.log_text()}",
    )
    return {"relay": relay, "worker": worker, "monitor": monitor, "request_id": request_id}


def family_names(exposition: str) -> set[str]:
    return {name for name, _labels in samples(exposition)} | {
        line.split()[2] for line in exposition.splitlines() if line.startswith("# TYPE ")
    }


def value(exposition: str, name: str, **labels: str) -> float:
    """The sum of the samples of ``name`` that have ``labels`` (others free)."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples(exposition).items() if n == name and wanted <= ls)


def missing_series(exposition: str, nonzero: dict[str, dict], declared: list[str]) -> list[str]:
    names = family_names(exposition)
    missing = [
        f"{name} {labels} is 0 or absent"
        for name, labels in nonzero.items()
        if value(exposition, name, **labels) <= 0
    ]
    missing += [f"{name} is not declared" for name in declared if name not in names]
    return missing


def test_after_one_job_every_process_shows_its_series_with_values(one_job_run, live_server):
    relay, worker, monitor = one_job_run["relay"], one_job_run["worker"], one_job_run["monitor"]
    backlog = ["hubdommed_outbox_pending_messages", "hubdommed_outbox_oldest_due_age_seconds"]

    def missing() -> dict[str, list[str]]:
        api_exposition = requests.get(f"{live_server.url}/metrics", timeout=10).text
        return {
            "api": missing_series(
                api_exposition,
                nonzero={
                    "hubdommed_http_requests_total": {
                        "route": "api/v1/jobs",
                        "method": "POST",
                        "status": "201",
                    },
                    "hubdommed_http_request_duration_seconds_count": {"route": "api/v1/jobs"},
                    "hubdommed_job_transitions_total": {"to": "succeeded"},
                    "hubdommed_job_time_to_running_seconds_count": {},
                    "hubdommed_job_time_to_finished_seconds_count": {"status": "succeeded"},
                },
                declared=[*backlog, "hubdommed_job_claim_refusals_total"],
            ),
            "relay": missing_series(
                relay.scrape(),
                nonzero={
                    "hubdommed_relay_batches_total": {"table": "outbox_messages"},
                    "hubdommed_relay_messages_sent_total": {"table": "outbox_messages"},
                    "hubdommed_relay_batch_duration_seconds_count": {"table": "outbox_messages"},
                    "hubdommed_relay_wakes_total": {},
                    "hubdommed_daemon_heartbeat_timestamp_seconds": {"daemon": "relay"},
                },
                declared=[
                    *backlog,
                    "hubdommed_relay_messages_refused_total",
                    "hubdommed_relay_messages_unconfirmed_total",
                ],
            ),
            "worker": missing_series(
                worker.scrape(),
                nonzero={
                    "hubdommed_task_runs_total": {
                        "task": "machines.power_on",
                        "outcome": "succeeded",
                    },
                    "hubdommed_task_run_duration_seconds_count": {"task": "machines.power_on"},
                    "hubdommed_daemon_heartbeat_timestamp_seconds": {"daemon": "worker"},
                },
                declared=["hubdommed_messages_dead_lettered_total"],
            ),
            "monitor": missing_series(
                monitor.scrape(),
                nonzero={
                    "hubdommed_monitor_cycles_total": {},
                    "hubdommed_daemon_heartbeat_timestamp_seconds": {"daemon": "monitor"},
                },
                declared=["hubdommed_monitor_jobs_total"],
            ),
        }

    # The last counts of the job may reach a process's metrics a moment after its end.
    wait_until(
        lambda: not any(missing().values()),
        timeout=20,
        interval=0.5,
        message=lambda: "series missing:\n" + json.dumps(missing(), indent=2),
    )
    api_exposition = requests.get(f"{live_server.url}/metrics", timeout=10).text
    # The backlog is the relay's and the API's to report, per table; not each worker's.
    for exposition in (api_exposition, relay.scrape()):
        for table in ("outbox_messages", "platform_outbox_messages"):
            assert ("hubdommed_outbox_pending_messages", frozenset({("table", table)})) in samples(
                exposition
            )
    assert "hubdommed_outbox_pending_messages" not in worker.scrape()


def test_the_relay_line_and_the_task_run_line_share_the_post_s_request_id(json_lines, one_job_run):
    # (json_lines first: it listens before the job is posted.)
    request_id = one_job_run["request_id"]
    relay, worker = one_job_run["relay"], one_job_run["worker"]

    def relayed() -> list[dict]:
        return [
            line
            for line in relay.json_lines()
            if line.get("message") == "relayed message"
            and line.get("event") == "JobCreated"
            and line.get("task") == "machines.power_on"
        ]

    def finished() -> list[dict]:
        return [
            line
            for line in worker.json_lines()
            if line.get("message") == "task run finished"
            and line.get("task") == "machines.power_on"
        ]

    relayed_lines = wait_until(relayed, timeout=20, message=lambda: relay.log.read_text())
    finished_lines = wait_until(finished, timeout=20, message=lambda: worker.log.read_text())

    # (Delivery is at least once: a row may be relayed, and its run finish, more than once.)
    relay_line = relayed_lines[0]
    assert relay_line["correlation_id"] == request_id
    assert relay_line["level"] == "DEBUG"
    run_lines = [line for line in finished_lines if line["run_id"] == relay_line["run_id"]]
    assert run_lines, finished_lines
    assert all(line["correlation_id"] == request_id for line in run_lines)
    assert run_lines[-1]["outcome"] == "succeeded"
    # The relay's batch line at INFO, for operators.
    assert any(
        line.get("message") == "relayed batch" and line.get("level") == "INFO"
        for line in relay.json_lines()
    )
    # And the API's line of the POST itself, in this process (the live server).
    http_lines = [
        line
        for line in json_lines.json()
        if line["logger"] == "hubdommed.http" and line.get("correlation_id") == request_id
    ]
    (post_line,) = [line for line in http_lines if line["path"] == "/api/v1/jobs"]
    assert post_line["method"] == "POST" and post_line["status"] == 201

    # The automation worker's claim and report carry the job's request id (and its job_id).
    # They come after the power-on's run finished: wait for both.
    def worker_calls(ending: str) -> list[dict]:
        return [
            line
            for line in json_lines.json()
            if line["logger"] == "hubdommed.http"
            and line.get("correlation_id") == request_id
            and line["path"].endswith(ending)
        ]

    claim_lines = wait_until(lambda: worker_calls("/start"), timeout=30, message="the claim")
    report_lines = wait_until(lambda: worker_calls("/complete"), timeout=30, message="the report")
    assert all(line.get("job_id") for line in [*claim_lines, *report_lines])
    assert post_line["tenant_id"]
