"""Atomic claims of node resources (GPU milli and memory, MIG slots, CPU, memory) in Redis.

Each node has a capacity hash and a used hash, field by field (``cpu``, ``mem``,
``g<i>.milli``, ``g<i>.mem``). A claim is a list of (node, field, amount) items; the
claim script checks every item against capacity and claims all or nothing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from tide.core.mig import MIG_MEMORY_SLOTS
from tide.schemas.node import NodeDescription
from tide.store import keys


def _script(name: str) -> str:
    return resources.files("tide.store").joinpath(f"lua/{name}").read_text()


def capacity_fields(node: NodeDescription) -> dict[str, int]:
    fields = {"cpu": node.cpu_milli, "mem": node.memory_mib}
    for gpu in node.gpus:
        fields[f"g{gpu.index}.milli"] = 1000
        fields[f"g{gpu.index}.mem"] = gpu.memory_mib
        if gpu.mig_capable:
            for slot in range(MIG_MEMORY_SLOTS):
                fields[f"g{gpu.index}.slot{slot}"] = 1
    return fields


@dataclass(frozen=True)
class ClaimItem:
    node_id: str
    field: str
    amount: int


@dataclass(frozen=True)
class PodClaim:
    job_id: str
    pod: str
    items: tuple[ClaimItem, ...]
    alloc: dict[str, Any]

    @property
    def key(self) -> str:
        return keys.claim(self.job_id, self.pod)


class ClaimStore:
    def __init__(self, redis: Redis) -> None:
        self.redis = redis
        self._claim = redis.register_script(_script("claim.lua"))
        self._release = redis.register_script(_script("release.lua"))

    async def set_capacity(self, node: NodeDescription) -> None:
        cap_key = keys.capacity(node.node_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(cap_key)
            pipe.hset(cap_key, mapping=capacity_fields(node))
            pipe.set(keys.node(node.node_id), node.model_dump_json())
            pipe.sadd(keys.NODES, node.node_id)
            await pipe.execute()

    async def claim(self, claims: list[PodClaim]) -> tuple[bool, str]:
        payload = {
            "index": keys.CLAIMS_INDEX,
            "claims": [
                {
                    "key": c.key,
                    "alloc": json.dumps(c.alloc),
                    "items": [
                        [keys.capacity(i.node_id), keys.used(i.node_id), i.field, i.amount] for i in c.items
                    ],
                }
                for c in claims
            ],
        }
        ok, reason = await self._claim(args=[json.dumps(payload)])
        return bool(ok), str(reason)

    async def release(self, claim_keys: list[str]) -> int:
        if not claim_keys:
            return 0
        return int(await self._release(args=[json.dumps({"index": keys.CLAIMS_INDEX, "keys": claim_keys})]))

    async def nodes(self) -> list[NodeDescription]:
        ids = sorted(await self.redis.smembers(keys.NODES))
        if not ids:
            return []
        raws = await self.redis.mget([keys.node(i) for i in ids])
        return [NodeDescription.model_validate_json(r) for r in raws if r]

    async def used(self, node_id: str) -> dict[str, int]:
        return {k: int(v) for k, v in (await self.redis.hgetall(keys.used(node_id))).items()}

    async def all_claims(self) -> dict[str, dict[str, Any]]:
        """claim key -> allocation, for every claim held."""
        claim_keys = sorted(await self.redis.smembers(keys.CLAIMS_INDEX))
        async with self.redis.pipeline(transaction=False) as pipe:
            for key in claim_keys:
                pipe.hget(key, "alloc")
            raws = await pipe.execute()
        return {key: json.loads(raw) for key, raw in zip(claim_keys, raws, strict=True) if raw}
