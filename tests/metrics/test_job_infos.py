"""The metrics service reads the specs that one turn's events ask for (a digest's 'placed' events: the gang size
for the gang wait) in one round trip, and keeps them (issue 17: one read per event)."""

from __future__ import annotations

import asyncio

from opentelemetry.sdk.metrics import MeterProvider
from redis.asyncio import Redis
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
from tide.settings import Settings
from tide.store import keys
from tide_metrics.service import MetricsService

from tests.helpers import count_mgets, job


async def test_one_turn_s_jobs_are_read_in_one_round_trip_and_kept(redis: Redis) -> None:
    await redis.flushdb()
    for job_id, replicas in (("a", 1), ("b", 4)):
        body = job(job_id, ["true"], replicas=replicas, gpu=1)
        record = JobRecord(job_id=job_id, spec=JobSpec.model_validate(body), submitted_at=0.0, updated_at=0.0)
        await redis.set(keys.job(job_id), record.to_json())
    svc = MetricsService(Settings())
    svc._instruments(MeterProvider().get_meter("test"))
    svc.redis = redis
    reads = count_mgets(redis)
    a, b, missing = await asyncio.gather(svc.job_info("a"), svc.job_info("b"), svc.job_info("gone"))
    assert reads == [[keys.job("a"), keys.job("b"), keys.job("gone")]]
    assert a is not None and b is not None and missing is None
    assert (a.gang, b.gang) == (1, 4)
    assert await svc.job_info("b") is b and len(reads) == 1, "kept: not read again"
