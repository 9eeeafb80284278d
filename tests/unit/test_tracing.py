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


SUBMITTER = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _memory_tracer():
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("t"), exporter


def test_a_stored_traceparent_is_the_parent_of_the_spans_started_under_it() -> None:
    """What the queue keeps in a job record (``current_traceparent``) and the placer continues (``stored_parent``)."""
    from tide.tracing import current_traceparent, stored_parent

    tracer, exporter = _memory_tracer()
    assert current_traceparent() is None  # no span: nothing to keep
    with stored_parent(SUBMITTER), job_span(tracer, "queue.submit", "j") as intake:
        kept = current_traceparent()
    assert kept is not None and kept.split("-")[1] == "0af7651916cd43dd8448eb211c80319c"
    assert kept.split("-")[2] == format(intake.get_span_context().span_id, "016x")
    with stored_parent(kept), job_span(tracer, "placer.reserve", "j"):
        pass
    with stored_parent(None), job_span(tracer, "other", "k"):  # no stored context: a trace of its own
        pass
    by_name = {s.name: s for s in exporter.get_finished_spans()}
    assert by_name["queue.submit"].parent is not None and by_name["queue.submit"].parent.span_id == 0xb7ad6b7169203331
    reserve = by_name["placer.reserve"]
    assert reserve.context.trace_id == intake.get_span_context().trace_id
    assert reserve.parent is not None and reserve.parent.span_id == intake.get_span_context().span_id
    assert by_name["other"].parent is None


def test_a_detached_span_continues_a_stored_context_and_is_ended_by_its_user(monkeypatch) -> None:
    import tide.tracing as tracing
    from opentelemetry import trace
    from tide.tracing import detached_job_span, traceparent_of

    tracer, exporter = _memory_tracer()
    span = detached_job_span(tracer, "placer.start", "j", SUBMITTER, pods=2)
    assert trace.get_current_span() is trace.INVALID_SPAN  # not made current
    carried = traceparent_of(span)
    assert carried is not None and carried.split("-")[1] == SUBMITTER.split("-")[1]
    assert not exporter.get_finished_spans()
    with trace.use_span(span, end_on_exit=True):
        pass
    [done] = exporter.get_finished_spans()
    assert done.attributes == {"tide.job_id": "j", "tide.pods": "2"} and done.parent.span_id == 0xb7ad6b7169203331
    monkeypatch.setattr(tracing, "_spans_wanted", False)
    off = detached_job_span(tracer, "placer.start", "j", SUBMITTER)
    assert off is trace.INVALID_SPAN and traceparent_of(off) is None
