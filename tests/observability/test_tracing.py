"""One job, one trace: from POST /api/v1/jobs to the webhook that tells of its end.

Every piece runs in this process, so that the SDK's in-memory exporter sees all the spans:
the API over HTTP (a live server started once the Django instrumentation is in place),
the relay's engine and the background worker's processor in threads (as the worker's tests
run them), and the automation's worker (its agent and its queue's consume loop) in a thread,
calling the live server over HTTP with its credential, running the demo command as a real
process. The broker, the database and the webhook's receiver are real. Between the pieces
only what production carries passes: the outbox envelope, the broker's message, the HTTP
requests and their headers.
"""

from __future__ import annotations

import fcntl
import os
import threading
import uuid

import pytest
import requests
from django.contrib.staticfiles.handlers import StaticFilesHandler
from django.test.testcases import LiveServerThread
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from opentelemetry.util._once import Once

from automation.agent.client import HubClient
from automation.agent.worker import AutomationWorker
from automation.machines.local import machines_dir
from common import tracing
from identity.tokens import issue_access_token
from tests.e2e.conftest import job_status
from tests.factories import ManagerFactory, UserFactory
from tests.polling import wait_until
from tests.webhook.conftest import Receiver
from tests.worker.conftest import BackgroundRelay, WorkerThread
from webhook.services import endpoint_create
from worker.builders import build_automation_worker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _install_provider(provider: TracerProvider | None) -> None:
    # The API lets a process set its provider once; its own test utilities
    # (opentelemetry-test-utils' reset_trace_globals) reset these globals the same way, so
    # that the tests after this one run untraced, as the process started.
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    if provider is not None:
        trace.set_tracer_provider(provider)


@pytest.fixture
def spans():
    """The SDK's provider with an in-memory exporter, and the instrumentations, for the test."""
    assert not tracing.active(), "tracing is off unless configured"
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _install_provider(provider)
    tracing.instrument()
    yield exporter
    tracing.uninstrument()
    provider.shutdown()
    _install_provider(None)
    assert not tracing.active()


@pytest.fixture
def hub(spans, settings):
    """The API over HTTP, with the Django instrumentation's middleware in its chain."""
    settings.ALLOWED_HOSTS = ["127.0.0.1"]
    server = LiveServerThread("127.0.0.1", StaticFilesHandler)
    server.daemon = True
    server.start()
    server.is_ready.wait()
    if server.error:
        raise server.error
    yield f"http://127.0.0.1:{server.port}"
    server.terminate()
    server.join()


@pytest.fixture
def receiver(settings):
    settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    server = Receiver()
    server.thread.start()
    yield server
    server.release.set()
    server.server.shutdown()
    server.server.server_close()


class AgentThread:
    """The automation's worker ``run_worker --automation`` runs, in a thread.

    It holds its local machine's lock, as the process the local provider starts does: the
    job's power-on finds the machine running (and issues no new credential).
    """

    def __init__(self, hub: str, slug: str, credential: str, machine_dir) -> None:
        self.lock = os.open(machines_dir() / f"{slug}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self.lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        client = HubClient(hub, credential)
        self.runtime = build_automation_worker(
            client, client.me(), poll_interval=3600, idle_timeout=None, outcomes_dir=machine_dir
        )
        # Beats while the demo command works, so that the trace shows them.
        self.runtime.agent.heartbeat_interval = 0.2
        self.thread = threading.Thread(target=self.runtime.run, name="agent", daemon=True)

    def start(self) -> AgentThread:
        self.thread.start()
        assert self.runtime.loop.wait_until_ready(15), "the automation's worker never got ready"
        return self

    def stop(self) -> None:
        self.runtime.loop.stop()
        self.runtime.agent.shutdown.set()
        self.thread.join(timeout=30)
        os.close(self.lock)
        assert not self.thread.is_alive(), "the automation's worker did not stop"


def named(spans: list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


def server_spans(spans: list[ReadableSpan], method: str, route: str) -> list[ReadableSpan]:
    """The Django instrumentation's spans of the requests to ``route`` (the URL pattern)."""
    return [
        span
        for span in spans
        if span.kind is SpanKind.SERVER
        and span.attributes.get("http.method", span.attributes.get("http.request.method")) == method
        and span.attributes.get("http.route") == route
    ]


def hex_id(span: ReadableSpan) -> str:
    return f"{span.context.trace_id:032x}"


def test_one_job_is_one_trace_from_its_post_to_its_webhook(
    hub,
    spans,
    catalog,
    tenant,
    receiver,
    json_lines,
    tmp_path,
    settings,
):
    settings.RELAY_SWEEP_INTERVAL = 0.1
    settings.LOCAL_MACHINES_DIR = str(tmp_path / "machines")
    created = catalog("traced")
    endpoint_create(
        tenant=tenant,
        url=receiver.url,
        event_types=["JobCompleted"],
        actor=ManagerFactory(tenant=tenant),
    )
    relay = BackgroundRelay().start()
    worker = WorkerThread(queues=("critical", "default")).start()
    agent = AgentThread(hub, "traced", created.credential, tmp_path / "outcomes").start()
    try:
        request_id = f"traced-{uuid.uuid4().hex}"
        person = UserFactory(tenant=tenant)
        answer = requests.post(
            f"{hub}/api/v1/jobs",
            json={"automation": created.automation.id, "params": {"name": "Ada", "sleep": 1}},
            headers={
                "Authorization": f"Bearer {issue_access_token(person).token}",
                "X-Request-ID": request_id,
            },
            timeout=30,
        )
        assert answer.status_code == 201, answer.text
        job_id = answer.json()["id"]
        wait_until(
            lambda: job_status(job_id) == "succeeded",
            timeout=60,
            message=lambda: f"job is {job_status(job_id)}",
        )
        wait_until(lambda: receiver.requests(), timeout=30, message="no webhook was delivered")
        # The delivery's span ends once its attempt is recorded.
        wait_until(
            lambda: named(spans.get_finished_spans(), "webhook.deliver POST"),
            timeout=30,
            message="the delivery's span never ended",
        )
    finally:
        agent.stop()
        worker.stop()
        relay.stop()
    assert relay.error is None and worker.error is None

    finished = list(spans.get_finished_spans())
    (create,) = server_spans(finished, "POST", "api/v1/jobs")
    trace_id = create.context.trace_id
    ours = [span for span in finished if span.context.trace_id == trace_id]
    names = {span.name for span in ours}

    # Every step of the job's path, in the one trace of the request that created it.
    expected = [
        "outbox.publish JobCreated",
        "relay.publish machines.power_on",
        "relay.publish worker.job_available",
        "worker.run machines.power_on",
        "agent.claim",
        "agent.job",
        "outbox.publish JobStarted",
        "outbox.publish JobCompleted",
        "outbox.dispatch webhook.deliver",
        "relay.publish webhook.deliver",
        "worker.run webhook.deliver",
        "webhook.deliver POST",
    ]
    missing = [name for name in expected if name not in names]
    assert not missing, f"not in the job's trace: {missing}; its spans: {sorted(names)}"
    # The hub's answers to the automation's worker joined it too: claim, beats, report.
    for path in ("start", "heartbeat", "complete"):
        served = server_spans(ours, "POST", f"api/v1/jobs/<int:job_id>/{path}")
        assert served, f"POST .../{path} is not in the job's trace"
        assert all(span.attributes.get("hubdommed.job_id") == job_id for span in served)
    # The database's statements, through the psycopg instrumentation.
    assert any(span.kind is SpanKind.CLIENT and "INSERT" in span.name for span in ours), names

    # The receiver was told which trace the delivery belongs to.
    (delivered,) = receiver.requests()
    assert delivered.headers["traceparent"].split("-")[1] == f"{trace_id:032x}"

    # The same trace id, beside the ids, in the JSON lines of every piece.
    trace_hex = f"{trace_id:032x}"
    lines = json_lines.json()
    traced = [line for line in lines if line.get("trace_id") == trace_hex]
    loggers = {line["logger"] for line in traced}
    assert {
        "hubdommed.http",
        "hubdommed.worker",
        "hubdommed.agent",
        "hubdommed.webhook",
    } <= loggers, loggers
    batches = [
        line
        for line in lines
        if line.get("message") == "relayed batch" and trace_hex in line.get("trace_ids", [])
    ]
    assert batches, "no relay batch line names the job's trace"
    assert all(line["level"] == "INFO" and line["run_ids"] for line in batches)
    # The automation's worker's lines name the job, its tenant and the creating request.
    agent_lines = [line for line in traced if line["logger"] == "hubdommed.agent"]
    assert any(f"job {job_id} succeeded" in line["message"] for line in agent_lines)
    for line in agent_lines:
        assert line["job_id"] == str(job_id) and line["tenant_id"] == str(tenant.id), line
        assert line["correlation_id"] == request_id, line
    # The delivery's lines name the job.
    webhook_lines = [line for line in traced if line["logger"] == "hubdommed.webhook"]
    assert webhook_lines and all(line["job_id"] == str(job_id) for line in webhook_lines)


def run_by_its_poll_alone(hub: str, catalog, tenant, slug: str, headers: dict) -> int:
    """POST a job, then have its automation's worker find it by its poll, claim and run it:
    no relay, so the job's message never reaches the worker. Returns the job's id."""
    created = catalog(slug)
    person = UserFactory(tenant=tenant)
    answer = requests.post(
        f"{hub}/api/v1/jobs",
        json={"automation": created.automation.id, "params": {"name": "poll"}},
        headers={"Authorization": f"Bearer {issue_access_token(person).token}", **headers},
        timeout=30,
    )
    assert answer.status_code == 201, answer.text
    job_id = answer.json()["id"]
    client = HubClient(hub, created.credential)
    agent = AutomationWorker(client, client.me(), stop_budget=5)
    try:
        assert agent.poll_once() == 1
        assert agent.claim_next(timeout=5)
        wait_until(lambda: agent.stats.succeeded == 1, timeout=30, message=lambda: agent.stats)
    finally:
        agent.shutdown.set()
        agent._drain()
        client.close()
    assert job_status(job_id) == "succeeded"
    return job_id


def test_a_job_found_by_the_poll_alone_is_claimed_and_reported_in_its_trace(
    hub, spans, catalog, tenant
):
    run_by_its_poll_alone(hub, catalog, tenant, "polled", headers={})

    finished = list(spans.get_finished_spans())
    (create,) = server_spans(finished, "POST", "api/v1/jobs")
    ours = [span for span in finished if span.context.trace_id == create.context.trace_id]
    names = {span.name for span in ours}
    assert {"agent.claim", "agent.job", "agent.report", "outbox.publish JobCompleted"} <= names
    for path in ("start", "complete"):
        assert server_spans(ours, "POST", f"api/v1/jobs/<int:job_id>/{path}"), path


def test_a_job_found_by_the_poll_alone_is_claimed_and_reported_under_its_request_id(
    hub, catalog, tenant, json_lines
):
    # Tracing or not: the correlation id of the POST that created the job is the hub's
    # way to follow it in the logs, whichever of the poll and the message reaches the
    # worker first (the poll won the race in a run of the end-to-end test).
    request_id = f"poll-{uuid.uuid4().hex}"
    job_id = run_by_its_poll_alone(
        hub, catalog, tenant, "polled-ids", headers={"X-Request-ID": request_id}
    )

    calls = {
        line["path"].rsplit("/", 1)[-1]: line
        for line in json_lines.json()
        if line["logger"] == "hubdommed.http" and f"/jobs/{job_id}/" in line.get("path", "")
    }
    for call in ("start", "complete"):
        assert calls[call]["correlation_id"] == request_id, calls[call]
        assert calls[call]["job_id"] == str(job_id), calls[call]
