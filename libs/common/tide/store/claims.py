"""Atomic claims of node resources (GPU milli and memory, MIG slots, CPU, memory) in Redis.

Each node has a capacity hash and a used hash, field by field (``cpu``, ``mem``,
``g<i>.milli``, ``g<i>.mem``, ``g<i>.slot<k>``). A claim is a list of (node, field, amount)
items; the claim script checks every item of every pod against capacity and claims all or
nothing. Claims taken under a reservation lapse after its TTL unless committed; the scripts
themselves release lapsed reservations before they do anything else, and so does the
reconciler's ``expire`` call. Every script is given every key it touches (Redis Cluster: one hash tag,
one slot), and a placer's scripts are fenced by its leader lease token.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

from redis.asyncio import Redis

from tide.core.mig import MIG_MEMORY_SLOTS
from tide.schemas.node import NodeDescription
from tide.store import keys

BASE_KEYS = [keys.CLAIMS_INDEX, keys.RESERVATIONS, keys.EXPIRED_RESERVATIONS, keys.PLACER_LEADER]
"""KEYS[1..4] of every claim script (store/lua/prelude.lua); the keys of the call follow them."""
LAPSE_MARGIN_MS = 2000
"""claim and commit name the reservations that lapse within this long of the client's look (Redis judges)"""
KEY_RETRIES = 20


class FencedOut(Exception):
    """A fenced script refused: the placer leader lease no longer holds this placer's token."""


def _gang_request(claims: list[PodClaim], reservation: str, ttl_ms: int) -> tuple[dict[str, Any], list[str]]:
    """One gang's request to claim.lua / claim_many.lua (prelude.lua's ``claim_gang``) and the keys it names."""
    items = [[[keys.capacity(i.node_id), keys.used(i.node_id), i.field, i.amount] for i in c.items] for c in claims]
    request = {
        "resv": reservation,
        "rkey": keys.reservation(reservation) if reservation else "",
        "ttl_ms": ttl_ms,
        "claims": [{"key": c.key, "alloc": json.dumps(c.alloc), "items": its}
                   for c, its in zip(claims, items, strict=True)],
    }
    own = [c.key for c in claims] + [k for its in items for it in its for k in it[:2]]
    if reservation:
        own.append(keys.reservation(reservation))
    return request, own


def _script(name: str) -> str:
    lua = resources.files("tide.store").joinpath("lua")
    return lua.joinpath("prelude.lua").read_text() + "\n" + lua.joinpath(name).read_text()


def _no_fence() -> str:
    return ""


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


@dataclass(frozen=True)
class RecordWrite:
    """A job record's compare-and-set (its stored JSON ``expected`` -> ``new``) with, in the same step, the
    release of claims (``release``: an exited pod's) or the commit of a reservation (``commit``: its id)."""

    job_id: str
    expected: str
    new: str
    release: tuple[str, ...] = ()
    commit: str = ""
    dequeue: bool = False  # with a reservation (``reserve_many``): the job leaves the pending set
    touches: tuple[str, ...] | None = None
    """The other keys the write touches, as the caller knows them (the released claims' used keys; the claim
    keys of the reservation and their used keys); None: not known, read before the script."""


WRITTEN, RECORD_CHANGED, RESERVATION_LAPSED = 1, 0, 2
"""``ClaimStore.write_records``' outcome of each write."""
RECORD_CHANGED_WHY = "record changed"
"""``ClaimStore.reserve_many``'s reason for a gang not claimed because its job's record held something else."""


class ClaimStore:
    """The claim scripts, each given every key it touches (``KEYS``), read from Redis just before the call.

    ``fence`` returns the caller's placer lease token; with one, every script refuses (``FencedOut``) unless
    the leader lease holds it. The default (no token) is unfenced: tests and tools."""

    def __init__(self, redis: Redis, fence: Callable[[], str] = _no_fence) -> None:
        self.redis = redis
        self.fence = fence
        self._claim = redis.register_script(_script("claim.lua"))
        self._commit = redis.register_script(_script("commit.lua"))
        self._claim_many = redis.register_script(_script("claim_many.lua"))
        self._release = redis.register_script(_script("release.lua"))
        self._expire = redis.register_script(_script("expire.lua"))
        self._extend = redis.register_script(_script("extend.lua"))
        self._record_writes = redis.register_script(_script("record_writes.lua"))

    async def set_capacity(self, node: NodeDescription) -> None:
        cap_key = keys.capacity(node.node_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.delete(cap_key)
            pipe.hset(cap_key, mapping=capacity_fields(node))
            pipe.set(keys.node(node.node_id), node.model_dump_json())
            pipe.sadd(keys.NODES, node.node_id)
            pipe.incr(keys.NODES_VERSION)
            await pipe.execute()

    # ------------------------------------------------------------ the keys a call touches
    async def _lapsed(self, until_ms: float) -> dict[str, str]:
        """Reservation id -> key, for every reservation whose TTL lapses by ``until_ms`` (Redis clock)."""
        ids = await self.redis.zrangebyscore(keys.RESERVATIONS, "-inf", int(until_ms))
        return {str(r): keys.reservation(str(r)) for r in ids}

    async def _touched(self, reservation_keys: list[str], claim_keys: list[str]) -> list[str]:
        """The claim keys of these reservations, and the used keys of all those claims and of ``claim_keys``."""
        found = list(claim_keys)
        if reservation_keys:
            async with self.redis.pipeline(transaction=False) as pipe:
                for rkey in reservation_keys:
                    pipe.hget(rkey, "claims")
                for raw in await pipe.execute():
                    found.extend(json.loads(raw) if raw else [])
        out = list(found)
        if found:
            async with self.redis.pipeline(transaction=False) as pipe:
                for ckey in found:
                    pipe.hget(ckey, "items")
                for raw in await pipe.execute():
                    out.extend(item[1] for item in (json.loads(raw) if raw else []))
        return out

    async def _run(self, script: Any, what: str, call_keys: Callable[[], Awaitable[tuple[list[str], Any]]],
                   hinted: Callable[[], Awaitable[tuple[list[str], Any]]] | None = None,
                   more_args: list[str] | None = None) -> list[Any]:
        """Run a script with the keys ``call_keys()`` gathers (an awaitable of (keys, request)); gather
        them again while the script names a key it was not given (a claim changed in between). With ``hinted``,
        the first try takes its keys from there instead (what the caller knows the call touches, read from no
        one): a hint that misses a key costs that try, never a wrong write (the script checks every key).
        ``more_args`` follow the token and the request in ARGV."""
        for attempt in range(KEY_RETRIES):
            touched, request = await (hinted if hinted is not None and attempt == 0 else call_keys)()
            result = await script(keys=BASE_KEYS + sorted(set(touched)),
                                  args=[self.fence(), json.dumps(request), *(more_args or [])])
            code = int(result[0])
            if code == -2:
                raise FencedOut(f"{what}: the placer leader lease is not ours")
            if code != -1:
                return list(result)
        raise RuntimeError(f"{what}: keys kept changing under the script ({result[1]})")

    # ------------------------------------------------------------ the scripts
    async def claim(self, claims: list[PodClaim], reservation: str = "", ttl_ms: int = 0) -> tuple[bool, str]:
        """Claim all pods' items or none. With ``reservation`` the claims lapse after ``ttl_ms`` unless committed."""
        if reservation and ttl_ms <= 0:
            raise ValueError("a reservation needs a positive ttl_ms")
        request, own = _gang_request(claims, reservation, ttl_ms)

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            lapsed = await self._lapsed(time.time() * 1000 + LAPSE_MARGIN_MS)
            touched = own + list(lapsed.values()) + await self._touched(list(lapsed.values()), [])
            return touched, {**request, "rkeys": lapsed}

        code, reason = await self._run(self._claim, "claim", call_keys)
        return code == 1, str(reason)

    async def reserve(self, claims: list[PodClaim], reservation: str, ttl_ms: int) -> tuple[bool, str]:
        return await self.claim(claims, reservation, ttl_ms)

    async def reserve_many(self, gangs: list[tuple[list[PodClaim], str]], ttl_ms: int,
                           lapsing: list[str] | None = None,
                           records: list[RecordWrite | None] | None = None) -> list[tuple[bool, str]]:
        """``reserve`` for several gangs (their claims, their reservation id) in one script call: each gang all
        or nothing on its own, in order, as if reserved one after the other.

        ``records``: for each gang, its job's record write (or None): the gang claims only if the record still
        holds ``expected``, and ``new`` is written in the same step (``dequeue``: the job leaves the pending
        set), so the reservation and the record naming it are one write; ``(False, RECORD_CHANGED_WHY)`` when
        the record held something else (nothing claimed).

        ``lapsing``: the reservations that may have lapsed by now, as the caller just read them (the placer's
        reconcile step reads every reservation's expiry each cycle). With none, nothing is read before the
        script; a reservation that lapsed unseen keeps its slots until the next sweep (a claim may be refused
        for them, never granted wrongly)."""
        if not gangs:
            return []
        if ttl_ms <= 0:
            raise ValueError("a reservation needs a positive ttl_ms")
        requests: list[dict[str, Any]] = []
        own: list[str] = []
        more_args: list[str] = []  # each record's expected and new JSON, after the token and the request
        pending: dict[str, str] = {}
        for (claims, reservation), record in zip(gangs, records or [None] * len(gangs), strict=True):
            request, gang_keys = _gang_request(claims, reservation, ttl_ms)
            if record is not None:
                request["record"] = {"job": keys.job(record.job_id), "at": 3 + len(more_args),
                                     "dequeue": record.job_id if record.dequeue else ""}
                more_args += [record.expected, record.new]
                gang_keys.append(keys.job(record.job_id))
                if record.dequeue:
                    pending = {"pending": keys.PENDING}
                    gang_keys.append(keys.PENDING)
            requests.append(request)
            own += gang_keys

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            lapsed = await self._lapsed(time.time() * 1000 + LAPSE_MARGIN_MS)
            touched = own + list(lapsed.values()) + await self._touched(list(lapsed.values()), [])
            return touched, {"rkeys": lapsed, "gangs": requests, **pending}

        async def none_lapsing() -> tuple[list[str], dict[str, Any]]:
            return own, {"rkeys": {}, "gangs": requests, **pending}

        _, out = await self._run(self._claim_many, "claim", call_keys, none_lapsing if lapsing == [] else None,
                                 more_args=more_args)
        return [(int(out[i]) == 1, str(out[i + 1])) for i in range(0, len(out), 2)]

    async def commit(self, reservation: str) -> bool:
        """Make the reservation's claims permanent; False when its TTL lapsed (they are gone)."""
        rkey = keys.reservation(reservation)

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            lapsed = await self._lapsed(time.time() * 1000 + LAPSE_MARGIN_MS)
            rkeys = sorted({rkey, *lapsed.values()})
            touched = rkeys + await self._touched(rkeys, [])
            return touched, {"rkeys": lapsed, "resv": reservation, "rkey": rkey}

        code, _ = await self._run(self._commit, "commit", call_keys)
        return code == 1

    async def extend(self, reservation: str, ttl_ms: int) -> bool:
        """Push a held reservation's lapse to ``ttl_ms`` from now (never earlier); False when it has lapsed."""
        request = {"resv": reservation, "ttl_ms": int(ttl_ms)}

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            return [], request

        code, _ = await self._run(self._extend, "extend", call_keys)
        return code == 1

    async def revive(self, reservation: str, ttl_ms: int) -> bool:
        """``extend`` for a reservation a new leader inherits, also one past its TTL that no sweep has released
        yet (no placer led since: its claims are still held), so the leader asks its agents whether the pods
        started before anything rolls it back; False when it is gone."""
        request = {"resv": reservation, "ttl_ms": int(ttl_ms), "revive": True}

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            return [], request

        code, _ = await self._run(self._extend, "extend", call_keys)
        return code == 1

    async def release(self, claim_keys: list[str], reservation: str = "", known: list[str] | None = None) -> int:
        """Release claims (a missing one is skipped) and, with ``reservation``, that reservation; returns how
        many claims were released. ``known``: the used keys of the claims' items as the caller knows them (saves
        reading the claims first; a hint that misses one costs a retry)."""
        if not claim_keys and not reservation:
            return 0
        rkey = keys.reservation(reservation) if reservation else ""
        request = {"claims": claim_keys, "resv": reservation, "rkey": rkey}

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            return [k for k in (rkey,) if k] + await self._touched([], claim_keys), request

        async def hinted() -> tuple[list[str], dict[str, Any]]:
            return [k for k in (rkey,) if k] + list(claim_keys) + list(known or []), request

        _, released = await self._run(self._release, "release", call_keys, hinted if known is not None else None)
        return int(released)

    async def write_records(self, writes: list[RecordWrite]) -> list[int]:
        """Compare-and-set job records, each with the release of its claims or the commit of its reservation, in
        one script call. Per write, in order: ``WRITTEN`` (the record went from ``expected`` to ``new`` and its
        claims were released or its reservation committed in the same step), ``RECORD_CHANGED`` (the record held
        something else: nothing of that write was done) or ``RESERVATION_LAPSED`` (the reservation to commit had
        lapsed and is released; the record untouched). When every write names the keys it ``touches``, nothing is
        read before the script (a hint that misses one costs a retry)."""
        if not writes:
            return []
        request = {"writes": [{"job": keys.job(w.job_id), "claims": list(w.release)}
                              | ({"commit": [w.commit, keys.reservation(w.commit)]} if w.commit else {})
                              for w in writes]}
        records = [raw for w in writes for raw in (w.expected, w.new)]
        rkeys = [keys.reservation(w.commit) for w in writes if w.commit]
        own = [keys.job(w.job_id) for w in writes] + [k for w in writes for k in w.release] + rkeys

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            return own + await self._touched(rkeys, [k for w in writes for k in w.release]), request

        async def hinted() -> tuple[list[str], dict[str, Any]]:
            return own + [k for w in writes for k in w.touches or ()], request

        known = all(w.touches is not None for w in writes)
        _, out = await self._run(self._record_writes, "record writes", call_keys, hinted if known else None,
                                 more_args=records)
        return [int(x) for x in out]

    async def expire(self) -> list[str]:
        """Release lapsed reservations; returns every reservation id that lapsed since the last call."""

        async def call_keys() -> tuple[list[str], dict[str, Any]]:
            seconds, micros = await self.redis.time()
            lapsed = await self._lapsed(int(seconds) * 1000 + int(micros) // 1000)
            rkeys = list(lapsed.values())
            return rkeys + await self._touched(rkeys, []), {"rkeys": lapsed}

        _, *expired = await self._run(self._expire, "expire", call_keys)
        return [str(r) for r in expired]

    async def reservations(self) -> dict[str, float]:
        """Reservation id -> expiry (ms, Redis clock) of every reservation held."""
        return {str(r): float(s) for r, s in await self.redis.zrange(keys.RESERVATIONS, 0, -1, withscores=True)}

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
