"""The metrics service follows job events without a second delivery of the terminal ones (issue 17)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from tide import subjects
from tide.bus.nats import ensure_streams
from tide.schemas.events import JobEvent, JobState
from tide.settings import Settings
from tide_metrics.service import MetricsService

from tests.node_agent.conftest import nats_url  # noqa: F401 - the bare NATS server fixture


def test_an_unknown_event_kind_has_no_subject() -> None:
    """A new kind must join the catalogue (which decides what metrics subscribes to) before it can be sent."""
    assert subjects.job_event("j", "placed") == "tide.events.job.j.placed"
    with pytest.raises(ValueError, match="unknown job event kind 'launched'"):
        subjects.job_event("j", "launched")
    assert not set(subjects.TERMINAL_EVENT_KINDS) & set(subjects.PROGRESS_EVENT_KINDS)


async def test_progress_events_come_on_plain_subscriptions_and_terminal_ones_only_durably(
        nats_url: str, redis_url: str) -> None:  # noqa: F811 - the fixture imported above
    svc = MetricsService(Settings(nats_url=nats_url, redis_url=redis_url))
    publisher = await nats.connect(nats_url)
    await ensure_streams(publisher.jetstream())
    await svc.start()
    try:
        for kind in ("queued", "placed", "running", "succeeded"):
            event = JobEvent(event_id=f"j.{kind}", job_id="j", kind=kind, state=JobState.PENDING)
            await publisher.publish(subjects.job_event("j", kind), event.to_bytes())
        await publisher.flush()
        for _ in range(50):
            if sum(s.delivered for s in svc._events) >= 3:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # a fourth delivery would have come by now
        assert sum(s.delivered for s in svc._events) == 3, "the terminal event is the durable consumer's alone"
        assert svc.timelines["j"].last.keys() >= {"queued", "placed", "running"}
    finally:
        await svc.close()
        await publisher.close()
