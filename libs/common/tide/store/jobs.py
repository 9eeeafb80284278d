"""Job records and the pending set in Redis."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError

from tide.schemas.events import JobRecord
from tide.store import keys
from tide.store.claims import FencedOut


def _no_fence() -> str:
    return ""


def _create_call(record: JobRecord, pending_score: float) -> tuple[list[str], list[Any]]:
    """The keys and arguments of ``create_job.lua`` for one new job."""
    return ([keys.job(record.job_id), keys.JOBS_INDEX, keys.PENDING],
            [record.to_json(), record.job_id, record.submitted_at, pending_score])


class JobStore:
    """Job records. ``fence`` returns the caller's placer lease token: with one, a record write (the
    compare-and-set) raises ``FencedOut`` unless the leader lease holds it; the default is unfenced (queue).
    ``cas`` runs the compare-and-set script (keys, args) instead of a call of its own, e.g. gathered with other
    jobs' into one pipeline (``cas_many``)."""

    def __init__(self, redis: Redis, fence: Callable[[], str] = _no_fence,
                 cas: Callable[[list[str], list[Any]], Awaitable[Any]] | None = None) -> None:
        self.redis = redis
        self.fence = fence
        self._cas_call = cas
        lua = resources.files("tide.store").joinpath("lua")
        self._cas = redis.register_script(lua.joinpath("cas.lua").read_text())
        self._create = redis.register_script(lua.joinpath("create_job.lua").read_text())

    async def create(self, record: JobRecord, pending_score: float) -> bool:
        """Store a new job and enqueue it; False (and no change) when the id already exists."""
        created = await self._create(*_create_call(record, pending_score))
        return bool(created)

    async def create_many(self, jobs: list[tuple[JobRecord, float]]) -> list[int]:
        """``create`` for each (record, pending score), in one pipeline, in order: the pending set's size once
        the job was stored and enqueued (a count the caller may keep instead of reading it), or 0 when the id
        existed."""
        results = await self._run_many(self._create, [_create_call(r, score) for r, score in jobs])
        for result in results:
            if isinstance(result, Exception):
                raise result
        return [int(result) for result in results]

    async def get(self, job_id: str) -> JobRecord | None:
        raw = await self.redis.get(keys.job(job_id))
        return JobRecord.model_validate_json(raw) if raw else None

    async def get_many(self, job_ids: list[str]) -> list[JobRecord | None]:
        if not job_ids:
            return []
        raws = await self.redis.mget([keys.job(j) for j in job_ids])
        return [JobRecord.model_validate_json(r) if r else None for r in raws]

    async def update(
        self, job_id: str, change: Callable[[JobRecord], bool]
    ) -> JobRecord | None:
        """Apply ``change`` atomically (read, change, compare-and-set; retried on a concurrent write).

        ``change`` returns False to leave the record as is; it may run more than once.

        Returns the record after the change, or None when the job does not exist or nothing changed.
        """
        result = await self.change(job_id, change)
        return result[0] if result is not None else None

    async def change(
        self, job_id: str, change: Callable[[JobRecord], bool], known: str | None = None, dequeue: bool = False,
        write: Callable[[str, str], Awaitable[Any]] | None = None, known_record: JobRecord | None = None,
    ) -> tuple[JobRecord, str] | None:
        """``update`` that starts from ``known`` (a serialised record the caller holds, saving a read) and
        returns the stored JSON with the record; with ``dequeue`` the job leaves the pending set in the
        same atomic step. A ``known`` that is out of date costs a read: it never decides anything (the
        compare-and-set refuses it, and a ``change`` that declines it is asked again on a fresh read).
        ``known_record``: the record ``known`` parses to, which the caller never changes in place: the first
        try changes a copy of it (``JobRecord.working_copy``) instead of parsing ``known`` again.

        ``write(expected, new)`` replaces the compare-and-set with one that does more in the same atomic step
        (the placer's: ``ClaimStore.write_records``, ``ClaimStore.reserve_many`` with records, which dequeue
        themselves): it answers as the compare-and-set does (true: written; false: the record held something
        else) or raises."""
        key = keys.job(job_id)
        raw = known
        parsed = known_record if known is not None else None
        while True:
            fresh = raw is None
            if fresh:
                raw = await self.redis.get(key)
                if raw is None:
                    return None
            record = parsed.working_copy() if parsed is not None else JobRecord.model_validate_json(raw)
            parsed = None  # a second try starts from what Redis holds
            if not change(record):
                if fresh:
                    return None
                raw = None  # declined on what may be stale: ask again on what Redis holds
                continue
            record.updated_at = time.time()
            new = record.to_json()
            cas_keys = [key, keys.PENDING, keys.PLACER_LEADER]
            cas_args = [raw, new, job_id if dequeue else "", self.fence()]
            if write is not None:
                done = await write(raw, new)
            elif self._cas_call is not None:
                done = await self._cas_call(cas_keys, cas_args)
            else:
                done = await self._cas(keys=cas_keys, args=cas_args)
            if done == -2:
                raise FencedOut(f"job {job_id}: the placer leader lease is not ours")
            if done:
                return record, new
            raw = None  # someone else changed it meanwhile: read it again and re-apply the change

    async def cas_many(self, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """Several compare-and-set scripts (keys, args) in one pipeline; each one's result, or its own error
        (``ResponseError``) as the value, in order."""
        return await self._run_many(self._cas, calls)

    async def _run_many(self, script: AsyncScript, calls: list[tuple[list[str], list[Any]]]) -> list[Any]:
        """``script`` once per (keys, args), in one pipeline; each call's result, or its own error
        (``ResponseError``) as the value, in order. A server that lost its script cache gets the script again."""
        if len(calls) == 1:
            try:
                return [await script(keys=calls[0][0], args=calls[0][1])]
            except ResponseError as exc:
                return [exc]
        async with self.redis.pipeline(transaction=False) as pipe:
            for call_keys, call_args in calls:
                pipe.evalsha(script.sha, len(call_keys), *call_keys, *call_args)
            results = await pipe.execute(raise_on_error=False)
        out: list[Any] = []
        for (call_keys, call_args), result in zip(calls, results, strict=True):
            if isinstance(result, NoScriptError):  # a restarted server: this call loads it
                try:
                    result = await script(keys=call_keys, args=call_args)
                except ResponseError as exc:
                    result = exc
            out.append(result)
        return out

    async def pending(self, limit: int = 1000) -> list[str]:
        return list(await self.redis.zrange(keys.PENDING, 0, limit - 1))

    async def dequeue(self, job_id: str) -> None:
        await self.redis.zrem(keys.PENDING, job_id)

    async def requeue(self, job_id: str, score: float) -> None:
        await self.redis.zadd(keys.PENDING, {job_id: score})

    async def request_stop(self, job_id: str) -> None:
        await self.redis.sadd(keys.CANCELLING, job_id)

    async def stop_requests(self) -> list[str]:
        return list(await self.redis.smembers(keys.CANCELLING))

    async def stop_done(self, job_id: str) -> None:
        await self.redis.srem(keys.CANCELLING, job_id)

    async def recent(self, limit: int = 50) -> list[JobRecord]:
        ids = await self.redis.zrevrange(keys.JOBS_INDEX, 0, limit - 1)
        if not ids:
            return []
        raws = await self.redis.mget([keys.job(i) for i in ids])
        return [JobRecord.model_validate_json(r) for r in raws if r]
