"""The placer's cached view of the cluster: registered nodes minus claims, and the jobs holding them.

Redis stays the authority. Each cycle the view diffs the claim index against what it has applied
(new claims are allocated, gone ones released) instead of rebuilding everything, and it rebuilds from
scratch every ``resync_s``, when the node set changes, or when told it is stale (a reservation it
thought would fit was refused by Redis). A stale view can only cost a refused reservation, never a
double allocation: the claim script checks every slot.
"""

from __future__ import annotations

import json
import time

import structlog
from redis.asyncio import Redis
from tide.core import Allocation, Cluster, OversubscriptionError
from tide.schemas.events import JobRecord
from tide.schemas.node import NodeDescription
from tide.store import keys
from tide.store.claims import ClaimStore

log = structlog.get_logger()
Running = dict[str, tuple[JobRecord, list[Allocation]]]


class ClusterView:
    def __init__(self, redis: Redis, claims: ClaimStore, resync_s: float) -> None:
        self.redis = redis
        self.claims = claims
        self.resync_s = resync_s
        self.nodes: list[NodeDescription] = []
        self.cluster = Cluster.from_descriptions([])
        self.allocs: dict[str, Allocation] = {}  # claim key -> allocation applied to ``cluster``
        self.records: dict[str, JobRecord] = {}  # newest known record of each job holding claims
        self._built = 0.0
        self._stale = True

    def invalidate(self) -> None:
        self._stale = True

    def remember(self, record: JobRecord | None) -> None:
        """Keep a record this placer just wrote (saves reading it back)."""
        if record is not None and record.job_id in self.records:
            self.records[record.job_id] = record

    async def refresh(self) -> tuple[list[NodeDescription], Cluster, Running]:
        node_ids = set(await self.redis.smembers(keys.NODES))
        claim_keys = set(await self.redis.smembers(keys.CLAIMS_INDEX))
        fresh = time.monotonic() - self._built < self.resync_s
        if self._stale or not fresh or node_ids != {n.node_id for n in self.nodes}:
            await self._rebuild(claim_keys)
        else:
            await self._apply_diff(claim_keys)
        return self.nodes, self.cluster, await self._running()

    async def _rebuild(self, claim_keys: set[str]) -> None:
        self.nodes = await self.claims.nodes()
        self.cluster = Cluster.from_descriptions(self.nodes)
        self.allocs = {}
        self.records = {}
        await self._add(sorted(claim_keys))
        self._built, self._stale = time.monotonic(), False

    async def _apply_diff(self, claim_keys: set[str]) -> None:
        for key in set(self.allocs) - claim_keys:
            alloc = self.allocs.pop(key)
            try:
                self.cluster.release(alloc)
            except OversubscriptionError:
                self._stale = True
        await self._add(sorted(claim_keys - set(self.allocs)))
        if self._stale:
            await self._rebuild(claim_keys)

    async def _add(self, claim_keys: list[str]) -> None:
        if not claim_keys:
            return
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in claim_keys:
                pipe.hget(key, "alloc")
            raws = await pipe.execute()
        for key, raw in zip(claim_keys, raws, strict=True):
            if not raw:
                continue  # released meanwhile
            alloc = Allocation.from_dict(json.loads(raw))
            try:
                self.cluster.allocate(alloc)
            except (OversubscriptionError, KeyError) as exc:
                log.warning("claim_replay_failed", claim=key, error=str(exc))
                continue
            self.allocs[key] = alloc

    async def _running(self) -> Running:
        by_job: dict[str, list[Allocation]] = {}
        for key, alloc in self.allocs.items():
            by_job.setdefault(key.split(":")[2], []).append(alloc)
        missing = [j for j in by_job if j not in self.records]
        if missing:
            raws = await self.redis.mget([keys.job(j) for j in missing])
            for job_id, raw in zip(missing, raws, strict=True):
                if raw:
                    self.records[job_id] = JobRecord.model_validate_json(raw)
        for job_id in set(self.records) - set(by_job):
            del self.records[job_id]
        return {j: (self.records[j], allocs) for j, allocs in by_job.items() if j in self.records}
