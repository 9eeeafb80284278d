"""Spans are recorded only when there is somewhere to export them."""

from __future__ import annotations

from tide.tracing import job_span, tracer_provider


def test_spans_are_not_recorded_without_an_exporter() -> None:
    tracer = tracer_provider("placer", None).get_tracer("t")
    with job_span(tracer, "placer.start", "job-1", pods=2) as span:
        assert not span.is_recording()


def test_spans_are_recorded_when_an_exporter_is_configured() -> None:
    tracer = tracer_provider("placer", "http://127.0.0.1:9/v1/traces").get_tracer("t")
    span = tracer.start_span("placer.start")  # never ended: nothing is sent to the (absent) collector
    assert span.is_recording()


def test_job_span_is_free_when_the_service_exports_nothing(monkeypatch) -> None:
    import tide.tracing as tracing
    from opentelemetry import trace

    monkeypatch.setattr(tracing, "_spans_wanted", False)  # what configure_tracing(name, None) sets
    tracer = tracer_provider("placer", "http://127.0.0.1:9/v1/traces").get_tracer("t")
    with job_span(tracer, "placer.start", "job-1") as span:
        assert span is trace.INVALID_SPAN
        assert trace.get_current_span() is trace.INVALID_SPAN  # no context was attached either
