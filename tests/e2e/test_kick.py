"""A job's ``queued`` event kicks the placer (issue 17: no kick message of its own): a lone job is placed at once,
not at the placer's next tick, and so is every job of a burst. A cancel still kicks (``tide_queue.service.Kicker``):
the running job is stopped at once."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import nats
from tide import subjects
from tide.client import TideClient
from tide.schemas.events import JobEvent
from tide.stack.launcher import service_user

from tests.helpers import job

# only kicks make the placer plan; a window longer than the queue takes for the burst on a busy test machine
LONG_TICK = {"placer": {"TIDE_PLACER_TICK_S": "60"}, "queue": {"TIDE_QUEUE_KICK_WINDOW_S": "0.1"}}


async def test_queued_events_kick_the_placer_and_a_cancel_kicks_it(make_stack) -> None:
    stack = make_stack(env=LONG_TICK)
    info = stack.info
    assert info is not None
    user = service_user("placer")
    spy = await nats.connect(info.nats_url, user=user, password=info.passwords[user], inbox_prefix="_INBOX_placer")
    client = await TideClient.connect(info.settings_for("admin"))
    kicks: list[float] = []
    placed: dict[str, float] = {}

    async def on_kick(msg) -> None:
        kicks.append(time.monotonic())

    async def on_placed(msg) -> None:
        placed.setdefault(JobEvent.model_validate_json(msg.data).job_id, time.monotonic())

    cancelled: dict[str, float] = {}

    async def on_cancelled(msg) -> None:
        cancelled.setdefault(JobEvent.model_validate_json(msg.data).job_id, time.monotonic())

    try:
        await spy.subscribe(subjects.PLACER_KICK, cb=on_kick)
        await client.nc.subscribe("tide.events.job.*.placed", cb=on_placed)
        await client.nc.subscribe("tide.events.job.*.cancelled", cb=on_cancelled)
        await spy.flush()
        await client.nc.flush()
        await asyncio.sleep(1.0)  # the registrations' cycles are over
        before = len(kicks)
        submitted = time.monotonic()
        assert (await client.submit(job("lone", ["sleep", "30"], gpu=1), job_id="lone-0")).accepted
        for _ in range(100):
            if "lone-0" in placed:
                break
            await asyncio.sleep(0.05)
        assert "lone-0" in placed, "a lone job waits for the placer's tick: it was not kicked"
        assert placed["lone-0"] - submitted < 3.0
        assert len(kicks) == before, "the queued event is the kick"

        await asyncio.sleep(0.2)
        before = len(kicks)
        burst = [f"burst-{i}" for i in range(12)]
        results = await asyncio.gather(*[client.submit(job("burst", ["sleep", "30"], gpu=1), job_id=j)
                                         for j in burst])
        assert all(r.accepted for r in results)
        for _ in range(200):
            if all(j in placed for j in burst):
                break
            await asyncio.sleep(0.05)
        assert all(j in placed for j in burst), sorted(set(burst) - set(placed))  # each queued event kicked
        assert len(kicks) == before

        await client.cancel("lone-0")
        for _ in range(100):
            if "lone-0" in cancelled:
                break
            await asyncio.sleep(0.05)
        assert "lone-0" in cancelled, "a cancel waits for the placer's tick: it was not kicked"
        assert len(kicks) - before == 1
    finally:
        await client.close()
        await spy.close()


def placer_cycles(url: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("tide_placer_cycle_duration_seconds_count"):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_while_jobs_come_fast_the_placer_paces_its_cycles(make_stack) -> None:
    """With a gap (here 0.5 s, at any arrival rate), a stream of jobs is placed in few cycles, each taking the jobs
    that came meanwhile; unpaced, each job's queued event starts a cycle of its own (tide_placer.pacing)."""
    stack = make_stack(env={"placer": {"TIDE_PLACER_TICK_S": "60", "TIDE_PLACER_CYCLE_GAP_S": "0.5",
                                       "TIDE_PLACER_CYCLE_GAP_ABOVE_PER_S": "0"}})
    info = stack.info
    assert info is not None
    (url,) = info.placer_metrics_urls.values()
    client = await TideClient.connect(info.settings_for("admin"))
    placed: set[str] = set()

    async def on_placed(msg) -> None:
        placed.add(JobEvent.model_validate_json(msg.data).job_id)

    try:
        await client.nc.subscribe("tide.events.job.*.placed", cb=on_placed)
        await client.nc.flush()
        await asyncio.sleep(1.0)  # the registrations' cycles are over
        before = placer_cycles(url)
        stream = [f"stream-{i}" for i in range(12)]
        for job_id in stream:  # one every 60 ms: unpaced, a cycle each
            assert (await client.submit(job("stream", ["sleep", "30"], gpu=1), job_id=job_id)).accepted
            await asyncio.sleep(0.06)
        for _ in range(100):
            if placed >= set(stream):
                break
            await asyncio.sleep(0.05)
        assert placed >= set(stream), sorted(set(stream) - placed)
        cycles = placer_cycles(url) - before
        assert 1 <= cycles <= 5, f"{cycles:g} cycles for 12 jobs over ~0.8 s with a 0.5 s gap"
    finally:
        await client.close()
