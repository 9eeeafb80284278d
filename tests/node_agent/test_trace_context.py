"""W3C trace context rides in NATS headers: a span started before a publish and the span of the handler that
consumes the message are one trace (through a real NATS server and JetStream); so are the placer's command span and
the agent's span for that command; and a job's spans in the queue, the placer and the agent are one trace, the
submitter's when it sent a ``traceparent`` (the queue -> placer hop goes through the job record in Redis)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import nats
import pytest
import tide.tracing as tracing
import tide_node_agent.service as agent_service
import tide_placer.service as placer_service
import tide_queue.service as queue_service
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Tracer
from tide import subjects
from tide.bus.nats import consume, ensure_streams, publish
from tide.client import TideClient
from tide.schemas.events import CancelJob, SettlePod, SubmitJob
from tide.schemas.job import JobSpec
from tide.schemas.node import default_h100_node
from tide.settings import Settings
from tide.subjects import ConsumerDef
from tide.tracing import TRACEPARENT, job_span, trace_headers
from tide_node_agent.gpu.simulated import SimulatedBackend
from tide_node_agent.service import NodeAgent
from tide_placer.service import PlacerService
from tide_queue.service import QueueService

from tests.helpers import job
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


SUBMITTER_A = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
SUBMITTER_B = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


async def test_a_job_s_spans_in_queue_placer_and_agent_are_one_trace(nats_url: str, redis_url: str, tmp_path: Path,
                                                                      spans, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queue, placer and agent in this process on a real NATS and Redis, all tracing into memory. Three one-GPU
    jobs, two submitted with a ``traceparent`` of their own, are queued before the placer runs, so its first cycle
    starts all three on the one node in one ``StartPods``: each job's ``queue.submit``, ``placer.reserve``,
    ``placer.start`` and ``agent.start`` spans are one trace, the submitter's when it sent one."""
    tracer, exporter = spans

    def named(name: str) -> dict[str, list]:
        """The finished spans called ``name``, by job."""
        out: dict[str, list] = {}
        for s in exporter.get_finished_spans():
            if s.name == name:
                out.setdefault(s.attributes["tide.job_id"], []).append(s)
        return out

    for module in (queue_service, placer_service, agent_service):
        monkeypatch.setattr(module, "tracer", tracer)
    monkeypatch.setattr(tracing, "_spans_wanted", True)
    settings = Settings(nats_url=nats_url, redis_url=redis_url, node_id="tn0", work_dir=tmp_path / "agent",
                        heartbeat_s=0.2, telemetry_s=0.4, placer_tick_s=0.1, placer_metrics_port=0)
    stop = asyncio.Event()
    queue, placer = QueueService(settings), PlacerService(settings)
    agent = NodeAgent(settings, SimulatedBackend(default_h100_node("tn0"), seed=1))
    tasks: list[asyncio.Task[None]] = []
    nc = await nats.connect(nats_url)
    try:
        await queue.start()
        tasks.append(asyncio.create_task(queue.run(stop)))
        submitted = {"ta": SUBMITTER_A, "tb": SUBMITTER_B, "tc": None, "td": None}
        for job_id, parent in submitted.items():
            if job_id == "td":
                continue
            sub = SubmitJob(job_id=job_id, spec=JobSpec.model_validate(job(job_id, ["true"], gpu=1)))
            headers = {"Nats-Msg-Id": sub.event_id, **({TRACEPARENT: parent} if parent else {})}
            await nc.jetstream().publish(subjects.JOB_SUBMIT, sub.to_bytes(), headers=headers)
        # a program submitting through TideClient under a span of its own: the job joins that trace
        with job_span(tracer, "test.program", "td") as program:
            assert (await TideClient(nc).submit(job("td", ["true"], gpu=1), job_id="td")).accepted
        submitted["td"] = f"00-{format(program.get_span_context().trace_id, '032x')}-0000000000000001-01"
        await _until(lambda: set(named("queue.submit")) == set(submitted))
        for service in (agent, placer):
            await service.start()
            tasks.append(asyncio.create_task(service.run(stop)))
        await _until(lambda: set(named("placer.start")) == set(submitted))  # ended on the commit, after the agent's
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for service in (placer, agent, queue):
            if hasattr(service, "nc"):
                await service.close()
        await nc.close()
    assert len(named("agent.start-batch")) == 1, "the four starts went in one StartPods"
    traces = set()
    for job_id, parent in submitted.items():
        [intake] = named("queue.submit")[job_id]
        steps = [*named("placer.reserve")[job_id], *named("placer.start")[job_id], *named("agent.start")[job_id]]
        assert {s.context.trace_id for s in steps} == {intake.context.trace_id}, job_id
        if parent:
            assert format(intake.context.trace_id, "032x") == parent.split("-")[1]
        traces.add(intake.context.trace_id)
        [start] = named("placer.start")[job_id]
        assert all(s.parent.span_id == start.context.span_id for s in named("agent.start")[job_id])
    assert len(traces) == 4  # each job a trace of its own (the batch's header names only the first)


async def _until(condition, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
