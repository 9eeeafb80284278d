"""The metrics service follows job progress and successes in the publishers' digests, one delivery for many
events, and takes failures, cancellations and rejections only through its durable consumer (issue 17)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig
from tide import events as events_module
from tide import subjects
from tide.bus.nats import ensure_streams
from tide.events import EventPublisher
from tide.schemas.events import JobEventDigest, JobRecord
from tide.schemas.feedback import family_of
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide_metrics.service import MetricsService

from tests.helpers import job
from tests.node_agent.conftest import nats_url  # noqa: F401 - the bare NATS server fixture


def test_an_unknown_event_kind_has_no_subject() -> None:
    """A new kind must join the catalogue (which decides what metrics is sent) before it can be sent."""
    assert subjects.job_event("j", "placed") == "tide.events.job.j.placed"
    with pytest.raises(ValueError, match="unknown job event kind 'launched'"):
        subjects.job_event("j", "launched")
    assert not set(subjects.TERMINAL_EVENT_KINDS) & set(subjects.PROGRESS_EVENT_KINDS)
    # every kind reaches metrics one way, and exactly one
    assert subjects.DIGEST_EVENT_KINDS | set(subjects.DURABLE_EVENT_KINDS) == subjects.JOB_EVENT_KINDS
    assert not subjects.DIGEST_EVENT_KINDS & set(subjects.DURABLE_EVENT_KINDS)
    assert "failed" in subjects.DURABLE_EVENT_KINDS, "an OOM failure is answered with a resubmission: never missed"


def record(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(job(job_id, ["true"], gpu=1)), submitted_at=0.0,
                     updated_at=0.0)


async def test_progress_and_success_reach_metrics_in_one_digest_and_failures_only_durably(
        nats_url: str, redis_url: str) -> None:  # noqa: F811 - the fixture imported above
    svc = MetricsService(Settings(nats_url=nats_url, redis_url=redis_url))
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    digests: list[JobEventDigest] = []

    async def on_digest(msg) -> None:
        digests.append(JobEventDigest.model_validate_json(msg.data))

    await nc.subscribe(subjects.EVENT_DIGEST, cb=on_digest)
    stored: list[str] = []

    async def on_event(msg) -> None:
        stored.append(msg.subject)

    await nc.subscribe(subjects.job_events("*"), cb=on_event)
    # the durable consumer as a version that took every terminal kind durably left it: narrowed at start
    await js.add_consumer("EVENTS", ConsumerConfig(
        durable_name=subjects.METRICS_EVENTS.durable, ack_policy=AckPolicy.EXPLICIT,
        filter_subjects=[subjects.job_event("*", k) for k in subjects.TERMINAL_EVENT_KINDS]))
    await svc.start()
    stop = asyncio.Event()
    running = asyncio.get_running_loop().create_task(svc.run(stop))
    events = EventPublisher(js, nc, window_s=1.0)  # longer than the eight publishes take, even on a loaded box
    ended: list[tuple[str, str]] = []
    timelines: dict[str, set[str]] = {}  # each job's kinds when it ended
    job_ended = svc._job_ended

    async def seen_ending(event, timeline) -> None:  # type: ignore[no-untyped-def]
        ended.append((event.job_id, event.kind))
        timelines[event.job_id] = set(timeline.last)
        await job_ended(event, timeline)

    svc._job_ended = seen_ending  # type: ignore[method-assign]
    try:
        for job_id, end in (("a", "succeeded"), ("b", "failed")):
            for kind in ("queued", "placed", "running", end):
                await events.publish(record(job_id), kind)
        for _ in range(250):
            if svc._events.delivered >= 1 and len(ended) == 2:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(1.2)  # a second digest, or a second delivery, would have come by now (one window)
        assert len(stored) == 8, "every event, terminal ones included, is on its own subject for users"
        assert svc._events.delivered == 1, "eight events, one of them a failure: one durable delivery"
        assert len(digests) == 1, "the other seven: one digest"
        assert [(e.job_id, e.kind) for e in digests[0].events] == [
            ("a", "queued"), ("a", "placed"), ("a", "running"), ("a", "succeeded"),
            ("b", "queued"), ("b", "placed"), ("b", "running")], "in order, no failure"
        family = family_of(record("a").spec)
        assert {(e.gang, e.family) for e in digests[0].events} == {(1, family)}, "what metrics needs of the job"
        assert sorted(ended) == [("a", "succeeded"), ("b", "failed")], "each ending handled once"
        assert timelines["a"] == {"queued", "placed", "running", "succeeded"}, "a success after its progress"
        consumer = await js.consumer_info("EVENTS", subjects.METRICS_EVENTS.durable)
        assert consumer.config.filter_subjects == [subjects.job_event("*", k) for k in subjects.DURABLE_EVENT_KINDS]
        assert consumer.delivered.stream_seq > 0 and consumer.num_pending == 0 and consumer.num_ack_pending == 0
    finally:
        stop.set()
        await running
        await events.flush()
        await svc.close()
        await nc.close()


async def test_a_digest_goes_at_once_when_full_and_whatever_is_left_on_flush(nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    sizes: list[int] = []

    async def on_digest(msg) -> None:
        sizes.append(len(JobEventDigest.model_validate_json(msg.data).events))

    await nc.subscribe(subjects.EVENT_DIGEST, cb=on_digest)
    events = EventPublisher(js, nc, window_s=60.0)  # never by the timer in this test
    try:
        for i in range(events_module.DIGEST_MAX_EVENTS + 3):
            await events.publish(record(f"j{i}"), "queued")
        await events.flush()
        await nc.flush()
        for _ in range(50):
            if sum(sizes) == events_module.DIGEST_MAX_EVENTS + 3:
                break
            await asyncio.sleep(0.02)
        assert sizes == [events_module.DIGEST_MAX_EVENTS, 3]
    finally:
        await nc.close()
