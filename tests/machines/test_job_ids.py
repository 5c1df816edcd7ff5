"""The automation worker's requests about a job carry the job's ids: the correlation id of
the request that created it as ``X-Request-ID`` and its trace as ``traceparent``, even for an
outcome an earlier worker kept on the machine's disk."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from automation.agent.client import AutomationInfo, HubClient, JobIds
from automation.agent.executor import Outcome
from automation.agent.spool import OutcomeSpool
from automation.agent.worker import AutomationWorker, report_of
from tests.polling import wait_until

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Hub:
    """Answers every report with ``{}`` and keeps the headers of each request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str]]] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hub.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                body = json.dumps({}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def hub():
    server = Hub()
    yield server
    server.server.shutdown()
    server.server.server_close()


def worker_with(hub: Hub, spool: OutcomeSpool) -> AutomationWorker:
    info = AutomationInfo(id=1, slug="ids", command=["true"], timeout_seconds=30, max_concurrency=1)
    return AutomationWorker(HubClient(hub.url, "credential"), info, spool=spool)


def test_a_kept_outcome_is_reported_with_the_ids_of_its_job(hub, tmp_path):
    spool = OutcomeSpool(tmp_path)
    ids = JobIds(correlation_id="creating-request", tenant_id=3, traceparent=TRACEPARENT)
    spool.put(report_of({"id": 7, "claim_token": "t-7"}, Outcome(True, exit_code=0), ids))

    agent = worker_with(hub, spool)
    assert agent.report_spooled() == 1
    wait_until(lambda: agent.stats.recovered == 1, timeout=10, message=lambda: hub.requests)

    ((path, headers),) = hub.requests
    assert path == "/api/v1/jobs/7/complete"
    assert headers["x-request-id"] == "creating-request"
    assert headers["traceparent"] == TRACEPARENT
    assert spool.pending() == []


def test_an_outcome_kept_without_ids_or_with_damaged_ones_is_reported_all_the_same(hub, tmp_path):
    spool = OutcomeSpool(tmp_path)
    older = report_of({"id": 8, "claim_token": "t-8"}, Outcome(True, exit_code=0))
    assert "ids" not in older  # as a worker before the ids kept them
    damaged = report_of({"id": 9, "claim_token": "t-9"}, Outcome(True, exit_code=0))
    damaged["ids"] = {"traceparent": 12, "unknown": "x", "tenant_id": True}
    spool.put(older)
    spool.put(damaged)

    agent = worker_with(hub, spool)
    agent.report_spooled()
    wait_until(lambda: agent.stats.recovered == 2, timeout=10, message=lambda: agent.stats)

    for _, headers in hub.requests:
        assert "traceparent" not in headers and "x-request-id" not in headers


@pytest.mark.parametrize("message_first", [True, False])
def test_the_poll_and_the_message_of_one_job_fill_each_others_ids(hub, tmp_path, message_first):
    # The poll names the job's correlation id and trace; its message, its tenant too.
    polled = JobIds(correlation_id="creating-request", traceparent=TRACEPARENT)
    message = JobIds(correlation_id="creating-request", tenant_id=3, traceparent=TRACEPARENT)
    agent = worker_with(hub, OutcomeSpool(tmp_path))
    for ids in (message, polled) if message_first else (polled, message):
        agent.offer(7, ids)
    assert agent._ids[7] == message
