"""One trace per job: OpenTelemetry spans, and the W3C ``traceparent`` that carries them.

A change committed by a request (a job created, a report) is the start of work that runs
later in other processes: the relay publishes its outbox rows, a worker runs their tasks,
the automation's worker claims and reports the job, a webhook delivery tells the tenant.
``outbox.services`` writes the current span's ``traceparent`` into each envelope at dispatch
time, and each of those steps opens its span under it (``span(..., traceparent=...)``), so
that all of them are one trace with the request that committed the change.

Tracing is off unless configured, through the SDK's own variables (``TRACING_ENABLED`` in
settings: ``OTEL_TRACES_EXPORTER``, ``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; ``OTEL_SDK_DISABLED=true`` wins). Off, no SDK
provider is installed and the API's tracer is the no-op one; the hot paths ask ``active()``
(or find no ``traceparent`` in the envelope) and do nothing more.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import (
    NoOpTracerProvider,
    ProxyTracerProvider,
    Span,
    SpanKind,
    StatusCode,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

logger = logging.getLogger("hubdommed.tracing")

_W3C = TraceContextTextMapPropagator()
# The tracer of the provider installed (``_tracer``), kept while that provider stays.
_tracer_of: tuple[Any, Any] = (None, None)
_instrumented = False

__all__ = [
    "Span",
    "SpanKind",
    "StatusCode",
    "active",
    "annotate",
    "begin_trace",
    "configure",
    "context_of",
    "current_ids",
    "current_traceparent",
    "inject",
    "maybe_span",
    "record_span",
    "span",
    "trace_id_of",
    "traceparent_of",
    "uninstrument",
]


def _tracer() -> trace.Tracer:
    global _tracer_of
    provider = trace.get_tracer_provider()
    if _tracer_of[0] is not provider:
        _tracer_of = (provider, provider.get_tracer("hubdommed"))
    return _tracer_of[1]


def active() -> bool:
    """True when an SDK provider records spans in this process (configured, or a test's)."""
    return not isinstance(trace.get_tracer_provider(), ProxyTracerProvider | NoOpTracerProvider)


def current_traceparent() -> str | None:
    """The current span as a W3C ``traceparent``, or None outside any recorded span."""
    return traceparent_of(trace.get_current_span())


def traceparent_of(recorded: Span) -> str | None:
    """``recorded`` as a W3C ``traceparent``, or None for a span that is not recorded."""
    context = recorded.get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"


def current_ids() -> tuple[str, str] | None:
    """``(trace_id, span_id)`` of the current span in hex, for log lines; None outside one."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id a W3C ``traceparent`` (``00-<trace id>-<span id>-<flags>``) names."""
    if not traceparent or not isinstance(traceparent, str):
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) == 4 else None


def context_of(traceparent: str | None) -> Context | None:
    """The parent a ``traceparent`` names (None: none, or not a valid one)."""
    if not traceparent or not isinstance(traceparent, str):
        return None
    context = _W3C.extract({"traceparent": traceparent})
    return context if trace.get_current_span(context).get_span_context().is_valid else None


def inject(headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Add the current span's ``traceparent`` (and ``tracestate``) to ``headers``."""
    _W3C.inject(headers)
    return headers


@contextmanager
def span(
    name: str,
    *,
    traceparent: str | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """A span, current in the block, under ``traceparent`` if given (else the current span)."""
    with _tracer().start_as_current_span(
        name, context=context_of(traceparent), kind=kind, attributes=_attributes(attributes)
    ) as current:
        yield current


def begin_trace(name: str, *, attributes: Mapping[str, Any] | None = None) -> Span:
    """A span that begins a trace of its own, whatever is current, and is not made current:
    for each of many pieces of work begun together that are each a trace (the jobs of a
    scheduler's batch). The caller ends it."""
    return _tracer().start_span(name, context=Context(), attributes=_attributes(attributes))


def annotate(**attributes: Any) -> None:
    """Set attributes (``hubdommed.<name>``) on the current span, if one is recorded."""
    current = trace.get_current_span()
    if current.is_recording():
        current.set_attributes(_attributes({f"hubdommed.{k}": v for k, v in attributes.items()}))


def maybe_span(name: str, **kwargs: Any) -> AbstractContextManager[Any]:
    """``span(...)`` when tracing is active, else nothing at all (for the hot paths)."""
    if not active():
        return nullcontext()
    return span(name, **kwargs)


def record_span(
    name: str,
    *,
    traceparent: str | None,
    started_ns: int,
    ended_ns: int | None = None,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
) -> None:
    """A span already over (started at ``started_ns``, ``time.time_ns()`` clock), under
    ``traceparent``: for work done for many traces at once, such as a relay's batch."""
    recorded = _tracer().start_span(
        name,
        context=context_of(traceparent),
        kind=kind,
        attributes=_attributes(attributes),
        start_time=started_ns,
    )
    recorded.end(end_time=ended_ns or time.time_ns())


def _attributes(attributes: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not attributes:
        return None
    # Spans take str, bool, int and float values; an id that is None is left out.
    return {
        key: value if isinstance(value, str | bool | int | float) else str(value)
        for key, value in attributes.items()
        if value is not None
    }


# --- set-up ------------------------------------------------------------------------------


def configure(settings: Any) -> bool:
    """Install the SDK's provider and the instrumentations when tracing is enabled.

    Called once per process when its apps are ready (before the first request is served:
    the Django instrumentation adds its middleware to ``MIDDLEWARE``). Returns whether
    tracing is on.
    """
    if not getattr(settings, "TRACING_ENABLED", False) or active():
        return active()
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {"service.name": settings.TRACING_SERVICE_NAME, "hubdommed.role": _role()}
    )
    provider = TracerProvider(resource=resource)
    for exporter in _exporters(settings.TRACING_EXPORTERS):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    instrument()
    logger.info("tracing on: exporting to %s", ", ".join(settings.TRACING_EXPORTERS) or "nothing")
    return True


def instrument() -> None:
    """The instrumentations of the libraries the hub uses: Django's requests, psycopg's
    statements, requests' calls (the automation worker's to the hub). Once per process."""
    global _instrumented
    if _instrumented:
        return
    _instrumented = True
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    # The probes and the metrics' scrapes would each be a trace of their own, every few
    # seconds: nothing an operator follows.
    DjangoInstrumentor().instrument(excluded_urls="health/.*,metrics")
    PsycopgInstrumentor().instrument()
    RequestsInstrumentor().instrument()


def uninstrument() -> None:
    """Undo ``instrument`` (a test that installed a provider of its own, then removes it)."""
    global _instrumented
    if not _instrumented:
        return
    _instrumented = False
    from opentelemetry.instrumentation.django import DjangoInstrumentor
    from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor
    from opentelemetry.instrumentation.requests import RequestsInstrumentor

    DjangoInstrumentor().uninstrument()
    PsycopgInstrumentor().uninstrument()
    RequestsInstrumentor().uninstrument()


def _exporters(names: tuple[str, ...]) -> list[Any]:
    exporters = []
    for name in names:
        if name == "otlp":
            # Reads OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT, _HEADERS, _TIMEOUT itself.
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        elif name == "console":
            from opentelemetry.sdk.trace.export import ConsoleSpanExporter

            exporters.append(ConsoleSpanExporter(out=sys.stderr))
    return exporters


def _role() -> str:
    """What this process is, for the spans' resource: the daemon's command, or ``web``."""
    if len(sys.argv) > 1 and sys.argv[0].endswith("manage.py"):
        return sys.argv[1]
    return "web"
