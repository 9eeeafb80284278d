"""Property: any sequence of reserve/commit/release/expire keeps the claim invariants (real Redis)."""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, PodClaim

from tests.helpers import small_node

NODES = ["n0", "n1", "n2"]
GPUS = 2

pod_items = st.lists(
    st.tuples(st.sampled_from(NODES), st.integers(0, GPUS - 1), st.sampled_from([250, 500, 1000])),
    min_size=1, max_size=3,
)
op = st.one_of(
    st.tuples(st.just("reserve"), st.lists(pod_items, min_size=1, max_size=3), st.sampled_from([1, 60_000])),
    st.tuples(st.just("claim"), st.lists(pod_items, min_size=1, max_size=2), st.just(0)),
    st.tuples(st.just("commit"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("release"), st.integers(0, 20), st.just(0)),
    st.tuples(st.just("expire"), st.just(0), st.just(0)),
)


async def check_invariants(redis: Redis) -> None:
    held: dict[tuple[str, str], int] = defaultdict(int)
    live_resv = set(await redis.zrange(keys.RESERVATIONS, 0, -1))
    for claim_key in await redis.smembers(keys.CLAIMS_INDEX):
        claim = await redis.hgetall(claim_key)
        assert claim, f"index names a missing claim {claim_key}"
        # every claim belongs to exactly one live reservation or is committed
        assert claim["resv"] == "" or claim["resv"] in live_resv, claim_key
        for _cap_key, used_key, field, amount in json.loads(claim["items"]):
            held[(used_key, field)] += int(amount)
    for resv in live_resv:
        members = json.loads(await redis.hget(keys.RESERVATION_PREFIX + resv, "claims"))
        for claim_key in members:
            assert await redis.hget(claim_key, "resv") == resv
    for node in NODES:
        cap = {k: int(v) for k, v in (await redis.hgetall(keys.capacity(node))).items()}
        used = {k: int(v) for k, v in (await redis.hgetall(keys.used(node))).items()}
        for field, amount in used.items():
            assert 0 <= amount <= cap[field], (node, field, amount)
            assert amount == held[(keys.used(node), field)], (node, field)


async def run_ops(redis_url: str, ops: list) -> None:
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        await redis.flushdb()
        store = ClaimStore(redis)
        for n in NODES:
            await store.set_capacity(small_node(n, gpus=GPUS))
        jobs: list[tuple[str, list[str], str]] = []  # (job, claim keys, reservation)
        for i, (kind, arg, ttl) in enumerate(ops):
            if kind in ("reserve", "claim"):
                job = f"j{i}"
                claims = [
                    PodClaim(job, f"{job}-{p}", tuple(ClaimItem(n, f"g{g}.milli", m) for n, g, m in pod), {})
                    for p, pod in enumerate(arg)
                ]
                resv = f"{job}:1" if kind == "reserve" else ""
                ok, _ = await store.claim(claims, resv, ttl)
                if ok:
                    jobs.append((job, [c.key for c in claims], resv))
            elif kind == "commit" and jobs:
                await store.commit(jobs[arg % len(jobs)][2] or "none")
            elif kind == "release" and jobs:
                job, claim_keys, resv = jobs.pop(arg % len(jobs))
                await store.release(claim_keys, resv)
            elif kind == "expire":
                await asyncio.sleep(0.003)
                await store.expire()
            await check_invariants(redis)
    finally:
        await redis.aclose()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(op, min_size=1, max_size=25))
def test_claim_scripts_keep_invariants(redis_url: str, ops: list) -> None:
    asyncio.run(run_ops(redis_url, ops))


async def test_lapsed_reservation_is_released_and_reported_once(redis: Redis) -> None:
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n0", gpus=1))
    claim = PodClaim("g", "g-0", (ClaimItem("n0", "g0.milli", 1000),), {})
    assert (await store.reserve([claim], "g:1", ttl_ms=20))[0]
    assert (await store.used("n0"))["g0.milli"] == 1000
    await asyncio.sleep(0.05)
    assert not await store.commit("g:1")  # too late: the TTL lapsed, the claims are gone
    assert (await store.used("n0"))["g0.milli"] == 0
    assert await store.expire() == ["g:1"]
    assert await store.expire() == []
    assert (await store.reserve([claim], "g:2", ttl_ms=60_000))[0]
    assert await store.commit("g:2")
    await asyncio.sleep(0.01)
    assert await store.expire() == []
    assert (await store.used("n0"))["g0.milli"] == 1000
