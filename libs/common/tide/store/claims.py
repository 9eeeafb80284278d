"""Atomic claims of node resources (GPU milli and memory, MIG slots, CPU, memory) in Redis.

Each node has a capacity hash and a used hash, field by field (``cpu``, ``mem``,
``g<i>.milli``, ``g<i>.mem``, ``g<i>.slot<k>``). A claim is a list of (node, field, amount)
items; the claim script checks every item of every pod against capacity and claims all or
nothing. Claims taken under a reservation lapse after its TTL unless committed; the scripts
themselves release lapsed reservations before they do anything else, and so does the
reconciler's ``expire`` call.
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

SCRIPT_KEYS = {
    "index": keys.CLAIMS_INDEX,
    "reservations": keys.RESERVATIONS,
    "resv_prefix": keys.RESERVATION_PREFIX,
    "expired": keys.EXPIRED_RESERVATIONS,
}


def _script(name: str) -> str:
    lua = resources.files("tide.store").joinpath("lua")
    return lua.joinpath("prelude.lua").read_text() + "\n" + lua.joinpath(name).read_text()


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
        self._commit = redis.register_script(_script("commit.lua"))
        self._release = redis.register_script(_script("release.lua"))
        self._expire = redis.register_script(_script("expire.lua"))

    async def set_capacity(self, node: NodeDescription) -> None:
        cap_key = keys.capacity(node.node_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(cap_key)
            pipe.hset(cap_key, mapping=capacity_fields(node))
            pipe.set(keys.node(node.node_id), node.model_dump_json())
            pipe.sadd(keys.NODES, node.node_id)
            pipe.incr(keys.NODES_VERSION)
            await pipe.execute()

    async def claim(self, claims: list[PodClaim], reservation: str = "", ttl_ms: int = 0) -> tuple[bool, str]:
        """Claim all pods' items or none. With ``reservation`` the claims lapse after ``ttl_ms`` unless committed."""
        if reservation and ttl_ms <= 0:
            raise ValueError("a reservation needs a positive ttl_ms")
        payload = {
            "keys": SCRIPT_KEYS,
            "resv": reservation,
            "ttl_ms": ttl_ms,
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

    async def reserve(self, claims: list[PodClaim], reservation: str, ttl_ms: int) -> tuple[bool, str]:
        return await self.claim(claims, reservation, ttl_ms)

    async def commit(self, reservation: str) -> bool:
        """Make the reservation's claims permanent; False when its TTL lapsed (they are gone)."""
        ok, _ = await self._commit(args=[json.dumps({"keys": SCRIPT_KEYS, "resv": reservation})])
        return bool(ok)

    async def release(self, claim_keys: list[str], reservation: str = "") -> int:
        if not claim_keys and not reservation:
            return 0
        payload = {"keys": SCRIPT_KEYS, "claims": claim_keys, "resv": reservation}
        return int(await self._release(args=[json.dumps(payload)]))

    async def expire(self) -> list[str]:
        """Release lapsed reservations; returns every reservation id that lapsed since the last call."""
        return [str(r) for r in await self._expire(args=[json.dumps({"keys": SCRIPT_KEYS})])]

    async def node_raws(self) -> dict[str, str]:
        """node id -> its stored description JSON, for every registered node, in node id order."""
        ids = sorted(await self.redis.smembers(keys.NODES))
        raws = await self.redis.mget([keys.node(i) for i in ids]) if ids else []
        return {node_id: raw for node_id, raw in zip(ids, raws, strict=True) if raw}

    async def nodes(self) -> list[NodeDescription]:
        return [NodeDescription.model_validate_json(raw) for raw in (await self.node_raws()).values()]

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
