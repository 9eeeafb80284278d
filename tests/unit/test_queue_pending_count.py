"""The queue's first limit check (is the pending set below every limit?) takes the pending set's size from its last
creation while that is fresh, rather than reading it for every submission (issue 17: one round trip per job)."""

from __future__ import annotations

from redis.asyncio import Redis
from tide.batch import Batcher
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store import keys
from tide.store.jobs import JobStore
from tide_queue import service as queue_module
from tide_queue.service import QueueService

from tests.helpers import job


async def test_the_pending_count_of_the_last_creation_stands_while_fresh(redis: Redis, monkeypatch) -> None:
    await redis.flushdb()
    svc = QueueService(Settings())
    svc.redis, svc.jobs = redis, JobStore(redis)
    svc._creates = Batcher(svc.jobs.create_many)
    svc._pending_counts = Batcher(svc._count_pending)
    await redis.zadd(keys.PENDING, {"other-1": 1.0, "other-2": 2.0})  # e.g. another queue replica's
    reads: list[int] = []
    real_zcard = redis.zcard

    async def counted_zcard(name: str) -> int:
        reads.append(1)
        return await real_zcard(name)

    redis.zcard = counted_zcard  # type: ignore[method-assign]
    assert await svc._pending_count() == 2 and len(reads) == 1, "nothing seen yet: read"
    assert await svc._pending_count() == 2 and len(reads) == 1, "the read's count stands"
    record = JobRecord(job_id="j", spec=JobSpec.model_validate(job("j", ["true"])), submitted_at=0.0, updated_at=0.0)
    assert await svc._create(record, 3.0)
    assert await svc._pending_count() == 3 and len(reads) == 1, "the creation's count stands"
    monkeypatch.setattr(queue_module, "PENDING_COUNT_FRESH_S", 0.0)
    await redis.zrem(keys.PENDING, "other-1")  # the placer took one
    assert await svc._pending_count() == 2 and len(reads) == 2, "stale: read again"
