"""Events published together go to JetStream as one fast-ingest batch (issue 17): n + 2 messages where one publish
each cost 2n, every event still stored exactly once, and a batch the server refuses sent again one by one."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.aio.msg import Msg
from nats.js.api import StreamConfig
from tide import subjects
from tide.bus.nats import (
    BATCH_DISABLED,
    BATCH_UNKNOWN,
    BatchRefused,
    FastBatches,
    _OpenBatch,
    batch_refusal,
    ensure_streams,
)
from tide.events import BATCH_MIN, EventPublisher
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


async def test_a_batch_costs_two_answers_and_drops_ids_stored_before(nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url, inbox_prefix="_INBOX_placer")
    js = nc.jetstream()
    await ensure_streams(js)
    batches = FastBatches(nc)
    # the subscription to the batches' answers is made once, even by two batches sent at once
    await asyncio.gather(batches.publish([event("j0")]), batches.publish([event("i0"), event("i1"), event("i2")]))
    sent, received = nc.stats["out_msgs"], nc.stats["in_msgs"]
    await batches.publish([event(f"j{i}") for i in range(1, 6)])
    assert nc.stats["out_msgs"] - sent == 5 and nc.stats["in_msgs"] - received == 2  # two answers for five
    stored = ["j0", "i0", "i1", "i2", *(f"j{i}" for i in range(1, 6))]
    assert [e.job_id for e in await stored_events(js)] == stored

    await batches.publish([event("k0"), event("j2"), event("k1")])  # j2 is stored: dropped, the others stored
    assert [e.job_id for e in await stored_events(js)] == [*stored, "k0", "k1"]
    with pytest.raises(ValueError):
        await batches.publish([])
    assert not batches._open
    await nc.close()


async def test_events_of_one_turn_share_a_batch_and_a_repeated_one_is_stored_once(nats_url: str) -> None:  # noqa: F811
    """Twenty publishes at once: every publisher returns once its event is stored, for two answers. Then a turn that
    repeats two stored events (a redelivered handler) among new ones: each event is in the stream once. Fewer than
    ``BATCH_MIN`` go one by one, one answer each."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    events = EventPublisher(js, nc, window_s=60.0)
    records = [make_record(f"job-{i}") for i in range(20)]
    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "queued") for r in records])
    assert nc.stats["in_msgs"] - received == 2
    assert sorted(e.job_id for e in await stored_events(js)) == sorted(r.job_id for r in records)

    again = [*records[:2], *(make_record(f"new-{i}") for i in range(BATCH_MIN))]
    await asyncio.gather(*[events.publish(r, "queued") for r in again])
    stored = [e.event_id for e in await stored_events(js)]
    assert len(stored) == 20 + BATCH_MIN and len(set(stored)) == len(stored)

    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "placed") for r in records[:BATCH_MIN - 1]])
    assert nc.stats["in_msgs"] - received == BATCH_MIN - 1
    assert events._batching
    await events.flush()
    await nc.close()


async def test_a_stream_without_fast_batches_still_stores_every_event(nats_url: str) -> None:  # noqa: F811
    """An EVENTS stream made by an older Tide (no ``allow_batched``): the server refuses the batch, and the publisher
    stores the events one by one from then on."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="EVENTS", subjects=[subjects.EVENTS_ALL]))
    events = EventPublisher(js, nc, window_s=60.0)
    records = [make_record(f"old-{i}") for i in range(BATCH_MIN + 2)]
    await asyncio.gather(*[events.publish(r, "placed") for r in records])
    assert not events._batching
    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "running") for r in records])
    assert nc.stats["in_msgs"] - received == len(records)  # one ack each: no batch tried again
    assert len(await stored_events(js)) == 2 * len(records)
    await events.flush()
    await nc.close()


async def test_ensure_streams_turns_fast_batches_on_for_an_existing_stream(nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(StreamConfig(name="EVENTS", subjects=[subjects.EVENTS_ALL]))
    await ensure_streams(js)
    assert (await js.stream_info("EVENTS")).config.allow_batched is True
    await nc.close()


def test_what_the_answers_to_a_batch_say() -> None:
    """A flow acknowledgement: nothing against the batch. The commit's ack: all counted, or not. A refusal (the
    server's code), a lost message (a gap). An ack naming no batch, from a server older than 2.14 that took each
    message as a plain publish: unknown, so the publisher sends them again one by one,
    de-duplicated by id, and stops batching."""
    assert batch_refusal({"type": "ack", "seq": 0, "msgs": 500}, 1, 3) is None
    assert batch_refusal({"stream": "EVENTS", "seq": 9, "batch": "b", "count": 3}, 3, 3) is None
    disabled = batch_refusal({"error": {"code": 400, "err_code": 10205, "description": "disabled"}, "seq": 0}, 1, 3)
    assert disabled is not None and disabled.err_code == BATCH_DISABLED
    gap = batch_refusal({"type": "gap", "last_seq": 1, "seq": 3}, 3, 3)
    assert gap is not None and gap.err_code == 0
    failed = batch_refusal({"type": "err", "seq": 2, "error": {"code": 400, "err_code": 10071, "description": "x"}},
                           2, 3)
    assert failed is not None and failed.err_code == 10071
    old_server = batch_refusal({"stream": "EVENTS", "seq": 9}, 1, 3)
    assert old_server is not None and old_server.err_code == BATCH_UNKNOWN
    short = batch_refusal({"stream": "EVENTS", "seq": 9, "batch": "b", "count": 2}, 3, 3)
    assert short is not None and short.err_code == 0


async def test_a_batch_sent_while_no_stream_answers_keeps_batching_on(nats_url: str) -> None:  # noqa: F811
    """No stream for the subjects yet (a clustered stream electing its leader answers so too): the server answers
    each message with a 503 status. That says nothing about fast batches: the events are stored one by one once
    the stream is there, and the publisher still batches."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    events = EventPublisher(js, nc, window_s=60.0)
    records = [make_record(f"early-{i}") for i in range(BATCH_MIN + 1)]

    async def stream_later() -> None:
        await asyncio.sleep(0.5)
        await ensure_streams(js)

    await asyncio.gather(stream_later(), *[events.publish(r, "queued") for r in records])
    assert events._batching
    assert sorted(e.job_id for e in await stored_events(js)) == sorted(r.job_id for r in records)
    received = nc.stats["in_msgs"]
    await asyncio.gather(*[events.publish(r, "placed") for r in records])
    assert nc.stats["in_msgs"] - received == 2  # batched again: two answers
    await events.flush()
    await nc.close()


async def test_an_inbox_prefix_with_dots_still_batches(nats_url: str) -> None:  # noqa: F811
    nc = await nats.connect(nats_url, inbox_prefix="_INBOX.tide.svc")
    await ensure_streams(nc.jetstream())
    batches = FastBatches(nc)
    await batches.publish([event(f"d{i}") for i in range(3)])
    received = nc.stats["in_msgs"]
    await batches.publish([event(f"e{i}") for i in range(3)])
    assert nc.stats["in_msgs"] - received == 2
    await nc.close()


async def test_an_answer_that_is_no_ack_refuses_the_batch_at_once() -> None:
    """Whatever comes back on a batch's subject ends its wait at once: a status (503) as a transient error, an
    unreadable body as a refusal (sent again one by one), a later answer to a finished batch ignored."""
    batches = FastBatches(nc=None)  # type: ignore[arg-type] - answers only: no connection needed
    loop = asyncio.get_running_loop()

    def answer(batch_id: str, seq: int, data: bytes, headers: dict[str, str] | None = None) -> Msg:
        return Msg(_client=None, subject=f"_INBOX_q.{batch_id}.500.fail.{seq}.1.$FI", data=data,  # type: ignore[arg-type]
                   headers=headers)

    cases = {"status": (b"", {"Status": "503"}), "text": (b'{"error": "text"}', None), "junk": (b"{no json", None),
             "list": (b"[1]", None)}
    for batch_id, (data, headers) in cases.items():
        batches._open[batch_id] = _OpenBatch(3, loop.create_future())
        await batches._on_reply(answer(batch_id, 1, data, headers))
        done = batches._open[batch_id].done
        assert done.done()
        expected = nats.errors.NoRespondersError if batch_id == "status" else BatchRefused
        assert isinstance(done.exception(), expected), (batch_id, done.exception())
        if isinstance(done.exception(), BatchRefused):
            assert done.exception().err_code == 0  # type: ignore[union-attr] - not BATCH_UNKNOWN: batching stays on
    await batches._on_reply(answer("text", 3, b'{"stream": "EVENTS", "seq": 1, "batch": "text", "count": 3}'))
    assert isinstance(batches._open["text"].done.exception(), BatchRefused)  # the first answer stands
