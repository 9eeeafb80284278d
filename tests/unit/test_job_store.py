"""Job records on a real Redis: concurrent updates never lose a change."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
from tide.store import keys
from tide.store.jobs import JobStore


async def test_concurrent_updates_all_apply(redis_url: str) -> None:
    clients = [Redis.from_url(redis_url, decode_responses=True) for _ in range(4)]
    try:
        stores = [JobStore(c) for c in clients]
        spec = JobSpec.model_validate({"metadata": {"name": "j"}, "spec": {"template": {"command": ["x"]}}})
        assert await stores[0].create(JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0), 1.0)
        assert not await stores[1].create(JobRecord(job_id="j", spec=spec, submitted_at=0, updated_at=0), 1.0)

        def bump(r: JobRecord) -> bool:
            r.attempts += 1
            return True

        await asyncio.gather(*[stores[i % 4].update("j", bump) for i in range(60)])
        record = await stores[0].get("j")
        assert record is not None and record.attempts == 60
        assert await stores[0].update("j", lambda r: False) is None  # no change, no write
        assert await stores[0].update("missing", bump) is None
        assert [r.job_id if r else None for r in await stores[0].get_many(["j", "missing"])] == ["j", None]
    finally:
        for c in clients:
            await c.aclose()


async def test_change_from_a_known_record_never_trusts_it(redis_url: str) -> None:
    """A cached copy saves a read when it is current; when it is stale it decides nothing."""
    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        store = JobStore(client)
        spec = JobSpec.model_validate({"metadata": {"name": "k"}, "spec": {"template": {"command": ["x"]}}})
        assert await store.create(JobRecord(job_id="k", spec=spec, submitted_at=0, updated_at=0), 1.0)
        stale = await client.get(keys.job("k"))

        def bump(r: JobRecord) -> bool:
            r.attempts += 1
            return True

        first = await store.change("k", bump, known=stale)
        assert first is not None and first[0].attempts == 1 and first[1] == await client.get(keys.job("k"))
        # the stale copy (attempts 0) is refused by compare-and-set: the change applies to the stored record
        second = await store.change("k", bump, known=stale)
        assert second is not None and second[0].attempts == 2
        # a change declined on the stale copy is asked again on the fresh one
        seen: list[int] = []

        def only_after_two(r: JobRecord) -> bool:
            seen.append(r.attempts)
            return r.attempts >= 2

        assert await store.change("k", only_after_two, known=stale) is not None
        assert seen[0] == 0 and seen[-1] == 2
        # dequeue leaves the pending set in the same step, and only when the write happens
        assert await store.pending() == ["k"]
        assert await store.change("k", lambda r: False, dequeue=True) is None
        assert await store.pending() == ["k"]
        assert await store.change("k", bump, dequeue=True) is not None
        assert await store.pending() == []
    finally:
        await client.aclose()
