"""Tracing is off unless the SDK's variables configure it; configured, a process exports its
spans over OTLP; off, nothing of it is in the process or in the envelopes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import transaction
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from common import tracing
from outbox.models import PlatformOutboxMessage
from outbox.services import dispatch
from tests.polling import wait_until

ROOT = Path(__file__).resolve().parents[2]
OTEL_VARIABLES = (
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_SDK_DISABLED",
)

# What a process set up with these variables reports of its tracing, on its last line.
PROBE = """
import json, django
django.setup()
from django.conf import settings
from common import tracing
from opentelemetry import trace
with tracing.span("probe", attributes={"hubdommed.probe": True}):
    traceparent = tracing.current_traceparent()
active = tracing.active()
if active:
    trace.get_tracer_provider().shutdown()  # exports what is left
print(json.dumps({
    "active": active,
    "traceparent": traceparent,
    "middleware": [m for m in settings.MIDDLEWARE if "opentelemetry" in m],
}))
"""


def probe(**variables: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in OTEL_VARIABLES} | variables
    return subprocess.run(
        [sys.executable, "-c", PROBE],
        cwd=ROOT,
        env={**env, "DJANGO_SETTINGS_MODULE": "hubdommed.settings"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def report(result: subprocess.CompletedProcess) -> dict:
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


class Collector:
    """An OTLP/HTTP receiver on loopback: keeps the spans each export request carries."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, dict]] = []
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                request = ExportTraceServiceRequest.FromString(body)
                for resource in request.resource_spans:
                    service = {a.key: a.value.string_value for a in resource.resource.attributes}
                    for scope in resource.scope_spans:
                        for span in scope.spans:
                            collector.spans.append((span.name, span.trace_id.hex(), service))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def collector():
    server = Collector()
    yield server
    server.server.shutdown()
    server.server.server_close()


def test_tracing_is_off_unless_configured():
    off = report(probe())
    assert off == {"active": False, "traceparent": None, "middleware": []}
    assert report(probe(OTEL_TRACES_EXPORTER="none"))["active"] is False
    # Configured, but switched off as the SDK's own variable says.
    disabled = report(
        probe(OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9", OTEL_SDK_DISABLED="true")
    )
    assert disabled["active"] is False


def test_an_otlp_endpoint_turns_tracing_on_and_the_spans_reach_the_collector(collector):
    on = report(probe(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_SERVICE_NAME="hub-test"))
    assert on["active"] is True
    assert on["middleware"], "the Django instrumentation's middleware is in the chain"
    trace_id = on["traceparent"].split("-")[1]
    wait_until(lambda: collector.spans, timeout=10, message="nothing was exported")
    ((_, exported_trace, service),) = [s for s in collector.spans if s[0] == "probe"]
    assert exported_trace == trace_id
    assert service["service.name"] == "hub-test" and service["hubdommed.role"] == "web"


def test_an_unknown_exporter_is_refused_at_start_up_naming_the_variable():
    result = probe(OTEL_TRACES_EXPORTER="jaeger")
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr and "OTEL_TRACES_EXPORTER" in result.stderr


@pytest.mark.django_db
def test_with_tracing_off_an_envelope_carries_no_trace():
    assert not tracing.active()
    with transaction.atomic():
        run_id = dispatch("machines.power_on", {"automation_id": 1})
    envelope = PlatformOutboxMessage.objects.get(run_id=run_id).envelope
    assert "traceparent" not in envelope
    assert envelope["run_id"] == str(run_id)
