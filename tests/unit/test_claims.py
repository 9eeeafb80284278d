"""The claim script on a real Redis: all or nothing, aggregated per field, idempotent release, races."""

from __future__ import annotations

import asyncio

from redis.asyncio import Redis
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, PodClaim

from tests.helpers import small_node


def claim(job: str, pod: str, *items: tuple[str, str, int]) -> PodClaim:
    return PodClaim(job, pod, tuple(ClaimItem(*i) for i in items), {"node": items[0][0]})


async def test_claim_is_all_or_nothing(redis: Redis) -> None:
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=2))
    ok, _ = await store.claim([claim("a", "a-0", ("n1", "g0.milli", 1000), ("n1", "cpu", 1000))])
    assert ok
    # the second pod does not fit (g0 is taken): nothing of the first pod may be claimed either
    ok, why = await store.claim([
        claim("b", "b-0", ("n1", "g1.milli", 1000)),
        claim("b", "b-1", ("n1", "g0.milli", 1000)),
    ])
    assert not ok and "insufficient g0.milli" in why
    assert await store.used("n1") == {"g0.milli": 1000, "cpu": 1000}
    assert not await redis.exists(keys.claim("b", "b-0"))


async def test_items_on_one_field_are_added_up(redis: Redis) -> None:
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=1))
    ok, _ = await store.claim([claim("s", "s-0", ("n1", "g0.milli", 600)), claim("s", "s-1", ("n1", "g0.milli", 600))])
    assert not ok
    ok, _ = await store.claim([claim("s", "s-0", ("n1", "g0.milli", 500)), claim("s", "s-1", ("n1", "g0.milli", 500))])
    assert ok and (await store.used("n1"))["g0.milli"] == 1000


async def test_release_is_idempotent_and_unknown_resources_are_refused(redis: Redis) -> None:
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=1))
    c = claim("a", "a-0", ("n1", "g0.milli", 1000), ("n1", "mem", 1024))
    assert (await store.claim([c]))[0]
    assert (await store.claim([c])) == (False, f"already claimed: {c.key}")
    assert await store.release([c.key]) == 1
    assert await store.release([c.key]) == 0
    assert await store.used("n1") == {"g0.milli": 0, "mem": 0}
    assert not await redis.sismember(keys.CLAIMS_INDEX, c.key)
    ok, why = await store.claim([claim("x", "x-0", ("n1", "g7.milli", 1))])
    assert not ok and "unknown resource" in why


async def test_racing_claims_for_one_gpu_have_one_winner(redis_url: str) -> None:
    clients = [Redis.from_url(redis_url, decode_responses=True) for _ in range(8)]
    try:
        await ClaimStore(clients[0]).set_capacity(small_node("n1", gpus=1))
        stores = [ClaimStore(c) for c in clients]
        results = await asyncio.gather(*[
            s.claim([claim(f"j{i}", f"j{i}-0", ("n1", "g0.milli", 1000))]) for i, s in enumerate(stores)
        ])
        assert sum(ok for ok, _ in results) == 1
        assert (await stores[0].used("n1"))["g0.milli"] == 1000
    finally:
        for c in clients:
            await c.aclose()
