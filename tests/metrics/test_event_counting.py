"""The metrics service counts and times job events from what the events carry (issue 17): the gang size and the
family come with each event, so a job's progress and a clean end read nothing from Redis; only an event from a
publisher that leaves them out costs the read of the job's spec. Events that need no I/O are handled at once."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from redis.asyncio import Redis
from tide import tracing
from tide.schemas.events import JobEvent, JobRecord, JobState
from tide.schemas.feedback import family_of
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store import keys
from tide_metrics.service import MetricsService

from tests.helpers import count_mgets, job


def service(redis: Redis) -> tuple[MetricsService, InMemoryMetricReader, list[list[str]]]:
    """A metrics service on ``redis`` with its instruments on an in-memory reader; the MGETs it makes are kept."""
    svc = MetricsService(Settings(feedback_enabled=False))
    reader = InMemoryMetricReader()
    svc._instruments(MeterProvider(metric_readers=[reader]).get_meter("test"))
    svc.redis = redis
    return svc, reader, count_mgets(redis)


def points(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    return [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics if m.name == name
            for p in m.data.data_points]


def event(job_id: str, kind: str, **fields: Any) -> JobEvent:
    return JobEvent(job_id=job_id, kind=kind, state=JobState.RUNNING, queue="default",
                    priority_class="offline-training", **fields)


async def store_gang(redis: Redis, job_id: str, replicas: int) -> JobSpec:
    spec = JobSpec.model_validate(job(job_id, ["train"], replicas=replicas, gpu=1))
    await redis.set(keys.job(job_id), JobRecord(job_id=job_id, spec=spec, submitted_at=0.0, updated_at=0.0).to_json())
    return spec


async def test_a_job_whose_events_carry_gang_and_family_is_counted_without_a_read(redis: Redis) -> None:
    await redis.flushdb()
    spec = await store_gang(redis, "g", 4)
    svc, reader, reads = service(redis)
    family = family_of(spec)
    for kind, fields in (("queued", {}), ("placed", {"wait_s": 2.0}), ("running", {}), ("succeeded", {})):
        await svc.handle_event(event("g", kind, gang=4, family=family, **fields))
    assert reads == [], "nothing read: the gang size and the family came with the events"
    counts = {p.attributes["kind"]: p.value for p in points(reader, "tide_job_events")}
    assert counts == {"queued": 1, "placed": 1, "running": 1, "succeeded": 1}
    [gang_wait] = points(reader, "tide_gang_wait")
    assert (gang_wait.count, gang_wait.sum) == (1, 2.0)
    assert "g" not in svc.timelines, "the job's timeline ended with it"


async def test_an_event_without_its_gang_size_reads_the_spec(redis: Redis) -> None:
    """A publisher older than ``JobEvent.gang``: the gang wait still counts a gang, from the stored spec."""
    await redis.flushdb()
    await store_gang(redis, "old", 4)
    await store_gang(redis, "one", 1)
    svc, reader, reads = service(redis)
    await svc.handle_event(event("old", "placed", wait_s=3.0))
    await svc.handle_event(event("one", "placed", wait_s=1.0, gang=1))
    assert reads == [[keys.job("old")]]
    [gang_wait] = points(reader, "tide_gang_wait")
    assert (gang_wait.count, gang_wait.sum) == (1, 3.0), "the 4-pod gang only"
    [queue_wait] = points(reader, "tide_queue_wait")
    assert queue_wait.count == 2


async def test_an_end_without_its_family_reads_the_spec(redis: Redis) -> None:
    await redis.flushdb()
    await store_gang(redis, "old", 1)
    svc, _, reads = service(redis)
    await svc.handle_event(event("old", "succeeded"))
    assert reads == [[keys.job("old")]]


async def test_progress_is_handled_at_once_and_an_end_in_a_task_the_next_event_waits_for(redis: Redis) -> None:
    await redis.flushdb()
    await store_gang(redis, "j", 1)
    svc, reader, reads = service(redis)
    svc._event_tails = {}
    svc._follow(event("j", "queued", gang=1, family="f"))
    svc._follow(event("j", "placed", gang=1, family="f", wait_s=0.5))
    # no await in between: both were counted in the calls themselves, and no task was left behind
    assert svc._event_tails == {}
    assert {p.attributes["kind"]: p.value for p in points(reader, "tide_job_events")} == {"queued": 1, "placed": 1}
    svc._follow(event("j", "failed"))  # no family: its end reads the spec, in a task
    ending = svc._event_tails["j"]
    svc._follow(event("j", "cancelled", gang=1, family="f"))  # after the end, in order
    after = svc._event_tails["j"]
    assert after is not ending
    await after
    assert ending.done() and reads == [[keys.job("j")]]
    counts = {p.attributes["kind"]: p.value for p in points(reader, "tide_job_events")}
    assert counts == {"queued": 1, "placed": 1, "failed": 1, "cancelled": 1}
    assert svc._event_tails == {}


async def test_a_job_s_trace_is_built_only_where_spans_are_exported(redis: Redis,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    await redis.flushdb()
    svc, _, _ = service(redis)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    svc.tracer = provider.get_tracer("test")
    for wanted, job_id in ((False, "quiet"), (True, "traced")):
        monkeypatch.setattr(tracing, "_spans_wanted", wanted)
        for kind in ("queued", "placed", "running", "succeeded"):
            await svc.handle_event(event(job_id, kind, gang=1, family="f", wait_s=1.0))
    spans = exporter.get_finished_spans()
    assert {s.attributes["tide.job_id"] for s in spans} == {"traced"}
    assert {s.name for s in spans} == {"job", "job.wait", "job.start", "job.run"}
