"""``tide.bus.nats.consume``: one pull request serves many messages (issue 17), at most ``batch`` in hand."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import nats
from tide import subjects
from tide.bus.nats import ArrivalRate, consume, ensure_streams, publish
from tide.schemas.events import CancelJob
from tide.subjects import ConsumerDef

from tests.node_agent.conftest import nats_url  # noqa: F401 - the bare NATS server fixture


@asynccontextmanager
async def consuming(js: Any, durable: str, handler: Callable[[Any], Awaitable[None]],
                    **options: Any) -> AsyncIterator[None]:
    """``consume`` on the cancel subject (a ``JOBS`` consumer named ``durable``) while the body runs; ``options``:
    its keyword arguments (batch, order_key, linger)."""
    stop = asyncio.Event()
    cdef = ConsumerDef("JOBS", durable, [subjects.JOB_CANCEL])
    task = asyncio.create_task(consume(js, cdef, handler, stop, **options))
    try:
        yield
    finally:
        stop.set()
        await task


async def test_messages_that_trickle_in_share_one_pull_request(nats_url: str) -> None:  # noqa: F811
    """Twenty messages 30 ms apart: each is handled, in order, and the consumer asks the server for them a few
    times, not once or twice per message as a fetch loop does."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    pulls: list[bytes] = []

    async def on_pull(msg) -> None:
        pulls.append(msg.data)

    await nc.subscribe("$JS.API.CONSUMER.MSG.NEXT.JOBS.trickle", cb=on_pull)
    handled: list[str] = []

    async def handler(msg) -> None:
        handled.append(CancelJob.model_validate_json(msg.data).job_id)
        await msg.ack()

    async with consuming(js, "trickle", handler):
        await asyncio.sleep(0.2)
        for i in range(20):
            await publish(js, subjects.JOB_CANCEL, CancelJob(job_id=f"j{i}"))
            await asyncio.sleep(0.03)
        for _ in range(200):
            if len(handled) == 20:
                break
            await asyncio.sleep(0.02)
    assert handled == [f"j{i}" for i in range(20)]
    assert 1 <= len(pulls) <= 4, f"{len(pulls)} pull requests for 20 messages"
    info = await js.consumer_info("JOBS", "trickle")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await nc.close()


async def test_no_more_than_a_batch_is_in_hand_while_the_handler_is_slow(nats_url: str) -> None:  # noqa: F811
    """A backlog of 60 and a slow handler: the consumer asks for the next batch only once it has handled the last,
    so the messages wait in the stream, not in its memory past their ack wait. (The server applies acks
    asynchronously: for a moment it may count a handled batch beside the next one, never more.)"""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    for i in range(60):
        await publish(js, subjects.JOB_CANCEL, CancelJob(job_id=f"b{i}"))
    handled: list[str] = []
    in_hand: list[int] = []

    async def handler(msg) -> None:
        await asyncio.sleep(0.005)
        handled.append(CancelJob.model_validate_json(msg.data).job_id)
        await msg.ack()

    async with consuming(js, "backlog", handler, batch=8):
        for _ in range(300):
            try:
                in_hand.append((await js.consumer_info("JOBS", "backlog")).num_ack_pending)
            except nats.js.errors.NotFoundError:
                pass
            if len(handled) == 60:
                break
            await asyncio.sleep(0.01)
    assert sorted(handled) == sorted(f"b{i}" for i in range(60)) and len(handled) == 60
    assert max(in_hand) <= 2 * 8, max(in_hand)
    await nc.close()


async def _overlapping_handlers(url: str, durable: str, linger_s: float,
                                linger_above_per_s: float = 0.0) -> tuple[list[str], bool]:
    """Two messages published 50 ms apart (by another client, as submitters are) to a consumer with ``linger_s``:
    whether the first one's handler was still running when the second one's started (they were handled as one
    batch: different keys run at once)."""
    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_streams(js)
    pub = await nats.connect(url)
    pub_js = pub.jetstream()
    handled: list[str] = []
    second_started = asyncio.Event()
    overlapped: list[bool] = []

    async def handler(msg) -> None:
        job_id = CancelJob.model_validate_json(msg.data).job_id
        if job_id == "first":
            try:
                await asyncio.wait_for(second_started.wait(), timeout=0.4)
                overlapped.append(True)
            except TimeoutError:
                overlapped.append(False)
        else:
            second_started.set()
        handled.append(job_id)
        await msg.ack()

    def key(msg) -> str:
        return CancelJob.model_validate_json(msg.data).job_id

    async with consuming(js, durable, handler, order_key=key, linger_s=linger_s,
                         linger_above_per_s=linger_above_per_s):
        await asyncio.sleep(0.2)
        await publish(pub_js, subjects.JOB_CANCEL, CancelJob(job_id="first"))
        await asyncio.sleep(0.05)
        await publish(pub_js, subjects.JOB_CANCEL, CancelJob(job_id="second"))
        for _ in range(100):
            if len(handled) == 2:
                break
            await asyncio.sleep(0.02)
    await pub.close()
    await nc.close()
    return handled, overlapped == [True]


async def test_a_linger_does_not_read_the_socket_until_it_ends(nats_url: str) -> None:  # noqa: F811
    """While a consumer lingers, its connection's socket is not read: what comes meanwhile (here a reply to a
    request on the same connection) is read in one go when the linger ends, instead of waking the process once per
    message. Read as it came, the reply would take milliseconds."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    other = await nats.connect(nats_url)

    async def respond(msg) -> None:
        await msg.respond(b"pong")

    await other.subscribe("linger.ping", cb=respond)
    await other.flush()
    handled = asyncio.Event()

    async def handler(msg) -> None:
        handled.set()
        await msg.ack()

    async with consuming(js, "quiet", handler, linger_s=0.6):
        await asyncio.sleep(0.2)
        await publish(other.jetstream(), subjects.JOB_CANCEL, CancelJob(job_id="start-a-linger"))
        await asyncio.sleep(0.1)  # the consumer is lingering now
        assert not handled.is_set()
        asked = asyncio.get_running_loop().time()
        reply = await nc.request("linger.ping", b"ping", timeout=3)
        waited = asyncio.get_running_loop().time() - asked
        assert reply.data == b"pong"
        assert waited > 0.25, f"the reply was read {waited * 1000:.0f} ms after the request, during the linger"
        await asyncio.wait_for(handled.wait(), timeout=2)
    await other.close()
    await nc.close()


async def test_a_linger_handles_messages_that_come_close_together_as_one_batch(nats_url: str) -> None:  # noqa: F811
    """With a linger of 300 ms the second message, 50 ms after the first, is in the first one's batch: its handler
    starts while the first one's runs."""
    handled, one_batch = await _overlapping_handlers(nats_url, "linger", linger_s=0.3)
    assert sorted(handled) == ["first", "second"] and one_batch


async def test_without_a_linger_a_message_is_handled_as_soon_as_it_comes(nats_url: str) -> None:  # noqa: F811
    """The same two messages without a linger: the first one's batch is only itself (the second, which comes while
    it is handled, waits for the next batch)."""
    handled, one_batch = await _overlapping_handlers(nats_url, "no-linger", linger_s=0.0)
    assert handled == ["first", "second"] and not one_batch


async def test_a_linger_above_a_rate_gathers_messages_that_come_that_fast(nats_url: str) -> None:  # noqa: F811
    """Lingering above 4 messages/s: the first message alone is that rate over the 0.25 s window, so the second
    one, 50 ms later, joins its batch."""
    handled, one_batch = await _overlapping_handlers(nats_url, "fast", linger_s=0.3, linger_above_per_s=4.0)
    assert sorted(handled) == ["first", "second"] and one_batch


async def test_a_message_below_the_linger_rate_is_handled_at_once(nats_url: str) -> None:  # noqa: F811
    """A linger of 5 s only above 1,000 messages/s: a lone message is handled at once, not after the linger."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_streams(js)
    handled = asyncio.Event()

    async def handler(msg) -> None:
        handled.set()
        await msg.ack()

    async with consuming(js, "lone", handler, linger_s=5.0, linger_above_per_s=1000.0):
        await asyncio.sleep(0.2)
        await publish(js, subjects.JOB_CANCEL, CancelJob(job_id="lone"))
        await asyncio.wait_for(handled.wait(), timeout=2.5)  # half the linger: it did not linger
    await nc.close()


def test_the_arrival_rate_counts_the_last_window_only() -> None:
    rate = ArrivalRate(0.25)
    for t in (10.0, 10.1, 10.2):
        rate.note(t)
    assert rate.per_s(10.2) == 12.0
    assert rate.per_s(10.4) == 4.0  # 10.0 and 10.1 are more than 0.25 s back
    assert rate.per_s(11.0) == 0.0
