"""Job record compare-and-sets gathered into one pipeline (``JobStore.cas_many``, the placer's ``cas`` hook): the
same records as one call each, a concurrent write still refused and retried, a flushed script cache survived."""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio import Redis
from tide.batch import Batcher
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
from tide.store import keys
from tide.store.jobs import JobStore

from tests.helpers import job


def record(job_id: str) -> JobRecord:
    return JobRecord(job_id=job_id, spec=JobSpec.model_validate(job(job_id, ["true"])), submitted_at=0, updated_at=0)


def batched(redis: Redis) -> tuple[JobStore, Batcher]:
    holder: dict[str, JobStore] = {}
    batch: Batcher[tuple[list[str], list[Any]], Any] = Batcher(lambda calls: holder["jobs"].cas_many(calls))

    async def cas(cas_keys: list[str], cas_args: list[Any]) -> Any:
        result = await batch((cas_keys, cas_args))
        if isinstance(result, BaseException):
            raise result
        return result

    holder["jobs"] = JobStore(redis, cas=cas)
    return holder["jobs"], batch


def set_reason(reason: str):
    def change(r: JobRecord) -> bool:
        r.reason = reason
        return True
    return change


async def test_concurrent_changes_go_in_one_pipeline(redis: Redis) -> None:
    await redis.flushdb()
    plain = JobStore(redis)
    for i in range(6):
        assert await plain.create(record(f"j{i}"), float(i))
    jobs, batch = batched(redis)
    known = {f"j{i}": await redis.get(keys.job(f"j{i}")) for i in range(6)}
    results = await asyncio.gather(*[jobs.change(f"j{i}", set_reason(f"r{i}"), known=known[f"j{i}"],
                                                 dequeue=i % 2 == 0) for i in range(6)])
    assert batch.batches == 1
    assert [r[0].reason for r in results if r] == [f"r{i}" for i in range(6)]
    assert [r.reason for r in await plain.get_many([f"j{i}" for i in range(6)]) if r] == [f"r{i}" for i in range(6)]
    assert await plain.pending() == ["j1", "j3", "j5"]


async def test_a_stale_copy_is_refused_and_the_change_applied_on_a_fresh_read(redis: Redis) -> None:
    await redis.flushdb()
    plain = JobStore(redis)
    await plain.create(record("a"), 1.0)
    await plain.create(record("b"), 2.0)
    stale = await redis.get(keys.job("a"))
    await plain.update("a", set_reason("someone else"))  # the copy below is out of date now
    jobs, _ = batched(redis)

    def append(r: JobRecord) -> bool:
        r.reason = f"{r.reason}+mine"
        return True

    a, b = await asyncio.gather(jobs.change("a", append, known=stale),
                                jobs.change("b", append, known=await redis.get(keys.job("b"))))
    assert a and a[0].reason == "someone else+mine"
    assert b and b[0].reason == "+mine"


async def test_a_flushed_script_cache_is_loaded_again(redis: Redis) -> None:
    await redis.flushdb()
    plain = JobStore(redis)
    for j in ("x", "y"):
        await plain.create(record(j), 1.0)
    await redis.script_flush()
    jobs, batch = batched(redis)
    done = await asyncio.gather(*[jobs.update(j, set_reason("after flush")) for j in ("x", "y")])
    assert [d.reason for d in done if d] == ["after flush", "after flush"]


async def test_submissions_created_together_are_one_pipeline_and_an_existing_id_is_refused(redis: Redis) -> None:
    """The queue's intake (``JobStore.create_many`` behind a ``Batcher``): each job stored and enqueued as ``create``
    would, a second record under a stored id refused and the stored one left as it was, after a flushed script
    cache too."""
    await redis.flushdb()
    jobs = JobStore(redis)
    first = record("a")
    first.reason = "first"
    assert await jobs.create(first, 5.0)
    await redis.script_flush()
    creates: Batcher[tuple[JobRecord, float], int] = Batcher(jobs.create_many)
    again = record("a")
    again.reason = "second"
    created = await asyncio.gather(*[creates((r, s)) for r, s in
                                     ((record("b"), 2.0), (again, 0.5), (record("c"), 1.0), (record("b"), 0.1))])
    assert creates.batches == 1
    assert created == [2, 0, 3, 0]  # stored ones: the pending set's size with them in it
    assert (await jobs.get("a")).reason == "first"  # type: ignore[union-attr]
    assert await jobs.pending() == ["c", "b", "a"]
    assert await redis.zrange(keys.JOBS_INDEX, 0, -1) == ["a", "b", "c"]
