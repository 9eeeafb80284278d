"""W3C trace context rides in NATS headers: a span started before a publish and the span of the handler that
consumes the message are one trace (through a real NATS server and JetStream); so are the placer's command span and
the agent's span for that command."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats
import pytest
import tide_node_agent.service as agent_service
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from tide import subjects
from tide.bus.nats import consume, ensure_streams, publish
from tide.schemas.events import CancelJob, SettlePod
from tide.subjects import ConsumerDef
from tide.tracing import TRACEPARENT, job_span, trace_headers

from tests.node_agent.conftest import AgentFactory


@pytest.fixture
def spans() -> tuple[Tracer, InMemorySpanExporter]:
    """An in-process tracer whose finished spans land in memory (the services' global provider is left alone)."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test"), exporter


async def test_a_consumed_message_continues_the_publishers_trace(nats_url: str, spans) -> None:
    tracer, exporter = spans
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    seen: asyncio.Queue = asyncio.Queue()

    async def handler(msg) -> None:
        with job_span(tracer, "test.handle", "job-t") as span:
            await seen.put((msg.headers, span.get_span_context()))
        await msg.ack()

    stop = asyncio.Event()
    cdef = ConsumerDef("JOBS", "trace-test", [subjects.JOB_CANCEL])
    task = asyncio.create_task(consume(js, cdef, handler, stop))
    try:
        with job_span(tracer, "test.publish", "job-t") as sender:
            await publish(js, subjects.JOB_CANCEL, CancelJob(job_id="job-t"))
        await publish(js, subjects.JOB_CANCEL, CancelJob(job_id="job-u"))  # no span current: no traceparent
        headers, handled = await asyncio.wait_for(seen.get(), 15)
        plain_headers, plain = await asyncio.wait_for(seen.get(), 15)
    finally:
        stop.set()
        await task
        await nc.close()
    sent = sender.get_span_context()
    assert TRACEPARENT in headers and "Nats-Msg-Id" in headers
    assert handled.trace_id == sent.trace_id
    parent = {s.name: s.parent for s in exporter.get_finished_spans() if s.context.span_id == handled.span_id}
    assert parent["test.handle"].span_id == sent.span_id  # a child of the publisher's span
    assert TRACEPARENT not in plain_headers and plain.trace_id != sent.trace_id  # a trace of its own


@dataclass
class FakeMsg:
    data: bytes
    headers: dict[str, str] | None
    reply: str = ""


async def test_the_agents_command_span_continues_the_placers_trace(make_agent: AgentFactory, spans,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    tracer, exporter = spans
    monkeypatch.setattr(agent_service, "tracer", tracer)
    agent = make_agent()
    command = SettlePod(job_id="j1", pod="j1-0.a1")
    with job_span(tracer, "placer.start", "j1") as placer_span:
        headers = trace_headers()
    assert headers is not None and TRACEPARENT in headers
    await agent._on_command(FakeMsg(command.to_bytes(), headers))  # type: ignore[arg-type]
    await agent._on_command(FakeMsg(command.to_bytes(), None))  # type: ignore[arg-type]
    settles = [s for s in exporter.get_finished_spans() if s.name == "agent.settle"]
    assert len(settles) == 2
    assert settles[0].context.trace_id == placer_span.get_span_context().trace_id
    assert settles[0].parent is not None and settles[0].parent.span_id == placer_span.get_span_context().span_id
    assert settles[1].parent is None  # a command without trace context starts its own trace


def test_no_trace_headers_without_a_span() -> None:
    assert trace_headers({"a": "b"}) == {"a": "b"}
    assert trace_headers() is None
