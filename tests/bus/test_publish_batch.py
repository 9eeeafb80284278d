"""Events published together go to JetStream as one atomic batch (issue 17): n + 1 messages where one publish
each cost 2n, every event still stored exactly once, and a batch the server refuses sent again one by one."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.api import StreamConfig
from tide import subjects
from tide.bus.nats import BATCH_UNKNOWN, BatchRefused, batch_refusal, ensure_streams, publish_batch
from tide.events import ATOMIC_MIN, EventPublisher
from tide.schemas.events import JobEvent, JobRecord
from tide.schemas.job import JobSpec
from tide.subjects import job_event

from tests.helpers import job
from tests.node_agent.conftest import nats_url  # noqa: F401 - the bare NATS server fixture


async def stored_events(js, subject: str = subjects.JOB_EVENTS_ALL) -> list[JobEvent]:
    sub = await js.subscribe(subject, ordered_consumer=True)
    events: list[JobEvent] = []
    while True:
        try:
            msg = await sub.next_msg(timeout=0.5)
        except nats.errors.TimeoutError:
            break
        events.append(JobEvent.model_validate_json(msg.data))
    await sub.unsubscribe()
    return events


def make_record(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(job(job_id, ["true"], gpu=1)), submitted_at=0.0,
                     updated_at=0.0)


def event(job_id: str, kind: str = "queued") -> tuple[str, bytes, dict[str, str]]:
    body = JobEvent(event_id=f"{job_id}.{kind}.0.", job_id=job_id, kind=kind, state="pending", reason="",
                    queue="default", priority_class="batch")
    return job_event(job_id, kind), body.to_bytes(), {"Nats-Msg-Id": body.event_id}


async def test_a_batch_is_stored_whole_with_one_ack_and_refused_whole_when_it_repeats_an_id(
        nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    sent, received = nc.stats["out_msgs"], nc.stats["in_msgs"]
    await publish_batch(nc, [event(f"j{i}") for i in range(5)])
    assert nc.stats["out_msgs"] - sent == 5 and nc.stats["in_msgs"] - received == 1  # one ack for five
    assert [e.job_id for e in await stored_events(js)] == [f"j{i}" for i in range(5)]

    with pytest.raises(BatchRefused) as refused:  # j2 was stored: nothing of this batch is
        await publish_batch(nc, [event("k0"), event("j2"), event("k1")])
    assert refused.value.err_code == 10201
    assert [e.job_id for e in await stored_events(js)] == [f"j{i}" for i in range(5)]
    with pytest.raises(ValueError):
        await publish_batch(nc, [])
    await nc.close()


async def test_events_of_one_turn_share_a_batch_and_a_repeated_one_is_stored_once(nats_url: str) -> None:  # noqa: F811
    """Twenty publishes at once: every publisher returns once its event is stored, for one ack. Then a turn that
    repeats two stored events (a redelivered handler) among new ones: the server refuses the batch, the publisher
    sends it one by one, and each event is in the stream once."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    events = EventPublisher(js, nc, window_s=60.0)
    records = [make_record(f"job-{i}") for i in range(20)]
    assert len(records) >= ATOMIC_MIN
    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "queued") for r in records])
    assert nc.stats["in_msgs"] - received == 1
    assert sorted(e.job_id for e in await stored_events(js)) == sorted(r.job_id for r in records)

    again = [*records[:2], *(make_record(f"new-{i}") for i in range(ATOMIC_MIN))]
    await asyncio.gather(*[events.publish(r, "queued") for r in again])
    stored = [e.event_id for e in await stored_events(js)]
    assert len(stored) == 20 + ATOMIC_MIN and len(set(stored)) == len(stored)

    received = nc.stats["in_msgs"]  # fewer than ATOMIC_MIN: one by one, no disk-staged batch for them
    await asyncio.gather(*[events.publish(r, "placed") for r in records[:3]])
    assert nc.stats["in_msgs"] - received == 3
    await events.flush()
    await nc.close()


async def test_a_stream_without_atomic_batches_still_stores_every_event(nats_url: str) -> None:  # noqa: F811
    """An EVENTS stream made by an older Tide (no ``allow_atomic``): the server refuses the batch, and the publisher
    stores the events one by one from then on."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="EVENTS", subjects=[subjects.EVENTS_ALL]))
    events = EventPublisher(js, nc, window_s=60.0)
    records = [make_record(f"old-{i}") for i in range(ATOMIC_MIN)]
    await asyncio.gather(*[events.publish(r, "placed") for r in records])
    assert not events._atomic
    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "running") for r in records])
    assert nc.stats["in_msgs"] - received == ATOMIC_MIN  # one ack each: no batch tried again
    assert len(await stored_events(js)) == 2 * ATOMIC_MIN
    await events.flush()
    await nc.close()


async def test_ensure_streams_turns_atomic_batches_on_for_an_existing_stream(nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="EVENTS", subjects=[subjects.EVENTS_ALL]))
    await ensure_streams(js)
    assert (await js.stream_info("EVENTS")).config.allow_atomic is True
    await nc.close()


def test_what_a_commit_ack_says() -> None:
    """All stored; refused (the server's code); an ack naming no batch, from a server older than 2.12 that took each
    message as a plain publish (compose.yaml's nats:2.10): unknown, so the publisher sends them again one by one,
    de-duplicated by id, and stops batching."""
    assert batch_refusal({"stream": "EVENTS", "seq": 9, "batch": "b", "count": 3}, 3) is None
    refused = batch_refusal({"error": {"code": 400, "err_code": 10201, "description": "duplicate"}, "seq": 0}, 3)
    assert refused is not None and refused.err_code == 10201
    old_server = batch_refusal({"stream": "EVENTS", "seq": 9}, 3)
    assert old_server is not None and old_server.err_code == BATCH_UNKNOWN
    short = batch_refusal({"stream": "EVENTS", "seq": 9, "batch": "b", "count": 2}, 3)
    assert short is not None and short.err_code == 0
