"""Job records on a real Redis: concurrent updates never lose a change."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
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
