"""OpenTelemetry tracing: one tracer per service, spans keyed by job id, OTLP export when configured."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON


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


@contextmanager
def job_span(tracer: trace.Tracer, name: str, job_id: str | None, **attrs: object) -> Iterator[trace.Span]:
    """A span carrying ``tide.job_id`` so a job's path can be followed across services."""
    if not _spans_wanted:
        yield trace.INVALID_SPAN
        return
    with tracer.start_as_current_span(name) as span:
        if job_id:
            span.set_attribute("tide.job_id", job_id)
        for key, value in attrs.items():
            span.set_attribute(f"tide.{key}", str(value))
        yield span
