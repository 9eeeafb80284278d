"""A placer killed between its gang's starts and the commit: the next leader takes the lease only after the old
lease's TTL, by when the gang's reservation may have lapsed too. The new leader asks the agents before any rollback
and adopts the gang that started (here: that already ran to its end), so no pod runs twice. Queue, two placers and
an agent in one process on real NATS and Redis (the CI at e854697 saw six gang pods completed twice after a
``kill -9`` of the placer in the HA chaos test)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

from redis.asyncio import Redis
from tide.client import TideClient
from tide.schemas.node import default_h100_node
from tide.settings import Settings
from tide.store.claims import RecordWrite
from tide.store.jobs import JobStore
from tide_node_agent.gpu.simulated import SimulatedBackend
from tide_node_agent.service import NodeAgent
from tide_placer.service import PlacerService
from tide_queue.service import QueueService

from tests.helpers import job

LEASE_TTL_S = 1.5  # the placer leader lease outlives the gang reservation, as with the defaults (5 s and 4 s)
RESERVATION_TTL_S = 0.5


async def test_a_new_leader_adopts_a_started_gang_whose_reservation_lapsed_while_none_led(
        nats_url: str, redis_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "runs"
    settings = Settings(nats_url=nats_url, redis_url=redis_url, node_id="rn0", work_dir=tmp_path / "agent",
                        heartbeat_s=0.2, telemetry_s=0.4, placer_tick_s=0.1, placer_metrics_port=0,
                        placer_lease_ttl_s=LEASE_TTL_S, placer_lease_renew_s=0.5,
                        reservation_ttl_s=RESERVATION_TTL_S)
    stop = asyncio.Event()
    queue, new = QueueService(settings), PlacerService(settings)
    agent = NodeAgent(settings, SimulatedBackend(default_h100_node("rn0"), seed=1))
    tasks: list[asyncio.Task[None]] = []
    redis = Redis.from_url(redis_url, decode_responses=True)
    # the old leader runs on an event loop of its own, in a thread: stopping that loop freezes it for good
    # between two steps, as kill -9 does (nothing of it runs again: no rollback, no renewal, no commit)
    old_loop = asyncio.new_event_loop()
    old_thread = threading.Thread(target=old_loop.run_forever, daemon=True)
    old_thread.start()
    old = PlacerService(settings)
    committing = threading.Event()

    async def killed_before_the_commit(*args: object, **kwargs: object) -> bool:
        committing.set()  # every start was acknowledged: the old leader dies here
        await asyncio.Event().wait()
        return False

    async def run_old() -> None:
        await old.start()
        old.claims.commit = killed_before_the_commit  # type: ignore[method-assign]
        write_records = old.claims.write_records

        async def killed_at_a_commit(writes: list[RecordWrite]) -> list[int]:  # a turn's records with commits
            if any(w.commit for w in writes):
                await killed_before_the_commit()
            return await write_records(writes)

        old.claims.write_records = killed_at_a_commit  # type: ignore[method-assign]
        old_loop.create_task(old.run(asyncio.Event()))

    client: TideClient | None = None
    try:
        for service in (queue, agent):
            await service.start()
            tasks.append(asyncio.create_task(service.run(stop)))
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(run_old(), old_loop))
        client = TideClient(await _connect(nats_url))
        spec = job("g", ["sh", "-c", f"echo ran >> {marker}"], replicas=2, gpu=1)
        assert (await client.submit(spec, job_id="g")).accepted
        assert await asyncio.to_thread(committing.wait, 30), "the old leader never got to the commit"
        old_loop.call_soon_threadsafe(old_loop.stop)
        await asyncio.to_thread(old_thread.join, 10)
        killed_at = time.monotonic()
        await _until(lambda: marker.exists() and len(marker.read_text().splitlines()) == 2)  # both pods ran, ended
        await asyncio.sleep(RESERVATION_TTL_S)  # the reservation's TTL passes with no leader

        await new.start()
        tasks.append(asyncio.create_task(new.run(stop)))
        final = await client.wait("g", timeout_s=30)
        assert time.monotonic() - killed_at > RESERVATION_TTL_S
        record = await JobStore(redis).get("g")
        assert final["state"] == "succeeded", final
        assert record is not None and record.attempts == 1 and record.reservation is None
        assert marker.read_text().splitlines() == ["ran", "ran"], "a pod of the gang ran again"
        assert not await new.claims.reservations()
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for service in (new, agent, queue):
            if hasattr(service, "nc"):
                await service.close()
        if client is not None:
            await client.nc.close()
        await redis.aclose()
        await asyncio.to_thread(_bury, old_loop, old)


def _bury(loop: asyncio.AbstractEventLoop, placer: PlacerService) -> None:
    """After the checks: cancel what the frozen leader left (its lease is gone: it can write nothing), close its
    connections and its loop."""
    if loop.is_running():
        loop.call_soon_threadsafe(loop.stop)
        time.sleep(0.2)
    left = asyncio.all_tasks(loop)
    for task in left:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
    if hasattr(placer, "nc"):
        loop.run_until_complete(placer.nc.close())
        loop.run_until_complete(placer.redis.aclose())
    loop.close()


async def _connect(url: str):  # noqa: ANN202 - a nats client
    import nats

    return await nats.connect(url)


async def _until(condition, timeout_s: float = 15.0) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)
