"""``ClaimStore.reserve_many`` / ``commit_many`` (one script call for a placer cycle's gangs) do what reserving and
committing each gang alone, one after the other, does."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, FencedOut, PodClaim

from tests.helpers import small_node


def gang(job: str, *pods: tuple[str, int, int]) -> tuple[list[PodClaim], str]:
    return [PodClaim(job, f"{job}-{i}", (ClaimItem(n, f"g{g}.milli", m), ClaimItem(n, "cpu", 1000)),
                     {"node_id": n}) for i, (n, g, m) in enumerate(pods)], f"{job}:1"


GANGS = [
    gang("a", ("n0", 0, 1000), ("n1", 0, 1000)),
    gang("b", ("n0", 0, 500)),  # a's GPU: refused whole
    gang("c", ("n0", 1, 500), ("n1", 1, 500)),
    gang("d", ("n1", 1, 500), ("n1", 1, 500)),  # c took half of n1's GPU 1: the two halves of d do not fit
    gang("e", ("n1", 1, 500)),  # but one does
]


async def state(redis: Redis) -> tuple:
    used = [await redis.hgetall(keys.used(n)) for n in ("n0", "n1")]
    claims = {k: await redis.hget(k, "resv") for k in await redis.smembers(keys.CLAIMS_INDEX)}
    return used, claims, await redis.zrange(keys.RESERVATIONS, 0, -1)


async def fresh(redis: Redis) -> ClaimStore:
    await redis.flushdb()
    store = ClaimStore(redis)
    for n in ("n0", "n1"):
        await store.set_capacity(small_node(n, gpus=2))
    return store


async def test_reserve_many_is_reserving_each_gang_in_turn(redis: Redis) -> None:
    store = await fresh(redis)
    alone = [await store.reserve(claims, resv, 30_000) for claims, resv in GANGS]
    state_alone = await state(redis)
    store = await fresh(redis)
    together = await store.reserve_many(GANGS, 30_000)
    assert [ok for ok, _ in together] == [True, False, True, False, True]
    assert together == alone
    assert await state(redis) == state_alone


async def test_commit_many_judges_each_reservation_on_its_own(redis: Redis) -> None:
    store = await fresh(redis)
    assert [ok for ok, _ in await store.reserve_many([GANGS[0], GANGS[2]], 30_000)] == [True, True]
    assert (await store.reserve(*GANGS[4], ttl_ms=100))[0]
    await asyncio.sleep(0.3)  # e's reservation lapses
    assert await store.commit_many(["a:1", "e:1", "c:1"]) == [True, False, True]
    used, claims, held = await state(redis)
    assert held == [] and set(claims.values()) == {""}  # a and c committed, e released
    assert sorted(claims) == sorted(keys.claim(j, f"{j}-{i}") for j in ("a", "c") for i in range(2))
    assert used[1]["g1.milli"] == "500"


async def test_a_fenced_batch_writes_nothing(redis: Redis) -> None:
    await fresh(redis)
    await redis.set(keys.PLACER_LEADER, "other")
    store = ClaimStore(redis, fence=lambda: "mine")
    with pytest.raises(FencedOut):
        await store.reserve_many(GANGS[:2], 30_000)
    with pytest.raises(FencedOut):
        await store.commit_many(["a:1", "c:1"])
    assert (await state(redis))[1] == {}


async def test_key_hints_save_the_reads_and_a_wrong_hint_only_costs_a_retry(redis: Redis) -> None:
    store = await fresh(redis)
    await store.reserve_many([GANGS[0], GANGS[2]], 30_000)
    a_keys = [c.key for c in GANGS[0][0]] + [keys.used("n0"), keys.used("n1")]
    calls: list[str] = []
    real = store._touched

    async def counted(*args: object) -> list[str]:
        calls.append("read")
        return await real(*args)  # type: ignore[arg-type]

    store._touched = counted  # type: ignore[method-assign]
    assert await store.commit_many(["a:1"], a_keys) == [True]
    assert calls == []  # the hint named every key: nothing read before the script
    assert await store.commit_many(["c:1"], [keys.used("n0")]) == [True]  # c's claim keys missing from the hint
    assert calls == ["read"]
    used_before = await redis.hgetall(keys.used("n1"))
    assert await store.release([keys.claim("a", "a-1")], known=[keys.used("n1")]) == 1
    assert calls == ["read"]
    assert await store.release([keys.claim("c", "c-1")], known=[keys.used("n0")]) == 1  # wrong node: re-read
    assert calls == ["read", "read"]
    used = await redis.hgetall(keys.used("n1"))
    assert int(used["g0.milli"]) == int(used_before["g0.milli"]) - 1000
    assert int(used["g1.milli"]) == int(used_before["g1.milli"]) - 500
