"""OpenTelemetry tracing: one tracer per service, spans keyed by job id, OTLP export when configured.

Trace context crosses the bus in NATS headers (W3C ``traceparent``/``tracestate``): ``trace_headers`` adds the
current span's to what a publisher sends (``tide.bus.nats.publish``, the placer's node commands), and
``remote_parent`` makes a received message's context current around its handler (``tide.bus.nats.consume``, the
agent's commands), so the handler's ``job_span`` is a child of the sender's span: one trace per job path.

One hop is not a message: the placer reads pending jobs from Redis. So the queue keeps its intake span's context in
the job record (``current_traceparent`` -> ``JobRecord.trace_parent``) and the placer makes it the parent of its
spans for the job (``stored_parent``, ``detached_job_span``); each ``StartPod`` carries its own ``traceparent`` too,
since one ``StartPods`` request (one header) holds the starts of several jobs, each of its own trace.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

W3C = TraceContextTextMapPropagator()
TRACEPARENT = "traceparent"


def tracer_provider(service: str, otlp_endpoint: str | None) -> TracerProvider:
    """Spans exported over OTLP when an endpoint is configured; without one they are not recorded at all
    (a recorded span that nobody exports costs CPU on every job; the logs still carry every job id)."""
    provider = TracerProvider(resource=Resource.create({"service.name": f"tide-{service}"}),
                              sampler=ALWAYS_ON if otlp_endpoint else ALWAYS_OFF)
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    return provider


_spans_wanted = True  # False once configure_tracing found no exporter: job_span then skips even the context


def configure_tracing(service: str, otlp_endpoint: str | None) -> trace.Tracer:
    global _spans_wanted
    _spans_wanted = otlp_endpoint is not None
    trace.set_tracer_provider(tracer_provider(service, otlp_endpoint))
    return trace.get_tracer(f"tide.{service}")


def spans_wanted() -> bool:
    """Whether spans are exported (``configure_tracing`` found an endpoint, or was not called): without, a span
    is not worth building."""
    return _spans_wanted


@contextmanager
def job_span(tracer: trace.Tracer, name: str, job_id: str | None, **attrs: object) -> Iterator[trace.Span]:
    """A span carrying ``tide.job_id`` so a job's path can be followed across services."""
    if not _spans_wanted:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name) as span:
        yield _tagged(span, job_id, attrs)


def _tagged(span: trace.Span, job_id: str | None, attrs: Mapping[str, object]) -> trace.Span:
    if job_id:
        span.set_attribute("tide.job_id", job_id)
    for key, value in attrs.items():
        span.set_attribute(f"tide.{key}", str(value))
    return span


def trace_headers(headers: dict[str, str] | None = None) -> dict[str, str] | None:
    """``headers`` plus the current span's W3C ``traceparent`` (and ``tracestate``); ``headers`` unchanged when no
    span is recording a trace (tracing off: nothing is added to any message)."""
    if not trace.get_current_span().get_span_context().is_valid:
        return headers
    out = dict(headers or {})
    W3C.inject(out)
    return out


def traceparent_of(span: trace.Span) -> str | None:
    """``span``'s W3C ``traceparent``, to keep where no header goes with it (a job record, one start of a batch);
    None for an invalid span (tracing off)."""
    if not span.get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier.get(TRACEPARENT)


def current_traceparent() -> str | None:
    """The current span's ``traceparent`` (``traceparent_of``); None when none is current (tracing off and no
    remote parent: nothing to continue)."""
    return traceparent_of(trace.get_current_span())


def detached_job_span(tracer: trace.Tracer, name: str, job_id: str | None, parent: str | None,
                      **attrs: object) -> trace.Span:
    """A ``job_span`` that is not made current and not ended here: a child of the ``parent`` traceparent (else of the
    current span), for a step whose start and end lie in different places (several jobs' starts go out in one
    request before each job's commit); make it current with ``trace.use_span(span, end_on_exit=True)``.
    ``INVALID_SPAN`` where the service exports nothing."""
    if not _spans_wanted:
        return trace.INVALID_SPAN
    context = W3C.extract({TRACEPARENT: parent}) if parent else None
    return _tagged(tracer.start_span(name, context=context), job_id, attrs)


@contextmanager
def remote_parent(headers: Mapping[str, str] | None) -> Iterator[None]:
    """Make the span context a message carries (``traceparent`` header) current while handling it, so the spans
    started meanwhile continue the sender's trace; without one, nothing changes."""
    if not headers or TRACEPARENT not in headers:
        yield
        return
    token = otel_context.attach(W3C.extract(dict(headers)))
    try:
        yield
    finally:
        otel_context.detach(token)


@contextmanager
def stored_parent(traceparent: str | None) -> Iterator[None]:
    """``remote_parent`` for a context kept as a ``traceparent`` string (a job record's, one start's); nothing
    changes without one."""
    with remote_parent({TRACEPARENT: traceparent} if traceparent else None):
        yield
