"""One job, one trace, across the real processes: the relay, the background worker and the
automation's worker (started by the local provider) as ``manage.py`` processes, each
exporting its spans over OTLP to a collector this test runs; the API in this process, its
spans in the SDK's in-memory exporter. The JSON log lines of every process carry the
trace's id.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import requests

from identity.tokens import issue_access_token
from tests.e2e.conftest import System, job_status
from tests.factories import ManagerFactory, UserFactory
from tests.observability.test_tracing import hub, receiver, server_spans, spans  # noqa: F401
from tests.observability.test_tracing_setup import Collector
from tests.polling import wait_until
from webhook.services import endpoint_create

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def collector():
    server = Collector()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def processes(hub, collector, broker_names, tmp_path):  # noqa: F811 (fixtures)
    machines = tmp_path / "machines"
    machines.mkdir()
    system = System(hub, machines, tmp_path)
    yield system
    system.stop()


def lines_of(path: Path) -> list[dict]:
    lines = []
    for raw in path.read_text(errors="replace").splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            line = json.loads(raw)
            if isinstance(line, dict):
                lines.append(line)
    return lines


def test_one_job_is_one_trace_across_the_processes_and_their_log_lines(
    processes,
    collector,
    spans,  # noqa: F811 (a fixture)
    receiver,  # noqa: F811 (a fixture)
    catalog,
    tenant,
    json_lines,
):
    created = catalog("exported")
    endpoint_create(
        tenant=tenant,
        url=receiver.url,
        event_types=["JobCompleted"],
        actor=ManagerFactory(tenant=tenant),
    )
    # Every process (and the automation's worker each inherits from the worker that powers
    # its machine on) exports to the collector, often, and logs JSON.
    tracing_env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "LOG_FORMAT": "json",
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
    }
    processes.start("relay", "run_relay", HUBDOMMED_RELAY="true", **tracing_env)
    processes.start(
        "worker", "run_worker", "--queues", "critical,default", "--concurrency", "2", **tracing_env
    )

    person = UserFactory(tenant=tenant)
    answer = requests.post(
        f"{processes.hub_url}/api/v1/jobs",
        json={"automation": created.automation.id, "params": {"name": "Ada"}},
        headers={"Authorization": f"Bearer {issue_access_token(person).token}"},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    (create,) = server_spans(spans.get_finished_spans(), "POST", "api/v1/jobs")
    trace_id = f"{create.context.trace_id:032x}"

    def exported(name: str) -> set[str]:
        return {
            service["hubdommed.role"]
            for span, trace, service in collector.spans
            if span == name and trace == trace_id
        }

    wait_until(
        lambda: job_status(job_id) == "succeeded",
        timeout=90,
        message=lambda: f"job is {job_status(job_id)}\n{processes.log_text()}",
    )
    # Each process exports its spans in batches, a parent after its children (the worker's
    # run of webhook.deliver ends after the POST it made): wait for every one of them.
    expected = [
        "relay.publish machines.power_on",
        "relay.publish webhook.deliver",
        "worker.run machines.power_on",
        "worker.run webhook.deliver",
        "agent.claim",
        "agent.job",
        "agent.report",
        "webhook.deliver POST",
    ]
    wait_until(
        lambda: all(exported(name) for name in expected),
        timeout=60,
        message=lambda: (
            f"missing {[n for n in expected if not exported(n)]}\n"
            f"{[s[:2] for s in collector.spans]}\n{processes.log_text()}"
        ),
    )

    # The spans of each process, in the trace of the POST served here.
    assert exported("relay.publish machines.power_on") == {"run_relay"}
    assert exported("relay.publish webhook.deliver") == {"run_relay"}
    assert exported("worker.run machines.power_on") == {"run_worker"}
    assert exported("worker.run webhook.deliver") == {"run_worker"}
    for name in ("agent.claim", "agent.job", "agent.report"):
        assert exported(name) == {"run_worker"}, name  # the automation's worker's process
    # The automation's worker's requests joined it on the hub (this process).
    ours = [s for s in spans.get_finished_spans() if f"{s.context.trace_id:032x}" == trace_id]
    for path in ("start", "complete"):
        assert server_spans(ours, "POST", f"api/v1/jobs/<int:job_id>/{path}"), path
    (delivered,) = receiver.requests()
    assert delivered.headers["traceparent"].split("-")[1] == trace_id

    # The trace's id on the JSON lines of every process: the API's (this one's)...
    assert any(
        line["logger"] == "hubdommed.http" and line.get("path") == "/api/v1/jobs"
        for line in json_lines.json()
        if line.get("trace_id") == trace_id
    )
    # ...the relay's, the worker's and the automation's worker's. A process writes its
    # lines below warnings up to LOG_FLUSH_SECONDS after they were logged, together: the
    # last ones may be on their way still.
    logs = processes.logs

    def relay_batches() -> list[dict]:
        return [
            line
            for line in lines_of(logs / "relay.log")
            if line.get("message") == "relayed batch" and trace_id in line.get("trace_ids", [])
        ]

    def worker_lines() -> list[dict]:
        return [line for line in lines_of(logs / "worker.log") if line.get("trace_id") == trace_id]

    def agent_lines() -> list[dict]:
        return [
            line
            for line in lines_of(processes.machines_dir / "exported.log")
            if line.get("trace_id") == trace_id
        ]

    wait_until(
        lambda: (
            relay_batches()
            and {line.get("task") for line in worker_lines()}
            >= {"machines.power_on", "webhook.deliver"}
            and any(f"job {job_id} succeeded" in line["message"] for line in agent_lines())
        ),
        timeout=10,
        message=lambda: f"the processes' lines of the trace\n{processes.log_text()}",
    )
    assert all(line["level"] == "INFO" for line in relay_batches())
    assert any(line["logger"] == "hubdommed.webhook" for line in worker_lines())
    assert all(line["job_id"] == str(job_id) for line in agent_lines())
