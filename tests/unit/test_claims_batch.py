"""``ClaimStore.reserve_many`` / ``write_records`` (one script call for a placer cycle's gangs) do what reserving and
committing each gang alone, one after the other, does."""

from __future__ import annotations

import asyncio

import pytest
from redis.asyncio import Redis
from tide.store import keys
from tide.store.claims import (
    RECORD_CHANGED,
    RECORD_CHANGED_WHY,
    RESERVATION_LAPSED,
    WRITTEN,
    ClaimItem,
    ClaimStore,
    FencedOut,
    PodClaim,
    RecordWrite,
)

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


async def test_commits_in_one_call_are_each_judged_on_their_own(redis: Redis) -> None:
    store = await fresh(redis)
    assert [ok for ok, _ in await store.reserve_many([GANGS[0], GANGS[2]], 30_000)] == [True, True]
    assert (await store.reserve(*GANGS[4], ttl_ms=100))[0]
    for job in ("a", "c", "e"):
        await redis.set(keys.job(job), "reserved")
    await asyncio.sleep(0.3)  # e's reservation lapses
    assert await store.write_records([RecordWrite(j, "reserved", "committed", commit=f"{j}:1") for j in "aec"]) == [
        WRITTEN, RESERVATION_LAPSED, WRITTEN]
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
        await store.write_records([RecordWrite("a", "", "committed", commit="a:1")])
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
    for job in ("a", "c"):
        await redis.set(keys.job(job), "reserved")
    assert await store.write_records([RecordWrite("a", "reserved", "committed", commit="a:1",
                                                  touches=tuple(a_keys))]) == [WRITTEN]
    assert calls == []  # the hint named every key: nothing read before the script
    assert await store.write_records([RecordWrite("c", "reserved", "committed", commit="c:1",
                                                  touches=(keys.used("n0"),))]) == [WRITTEN]  # c's claims not named
    assert calls == ["read"]
    used_before = await redis.hgetall(keys.used("n1"))
    assert await store.release([keys.claim("a", "a-1")], known=[keys.used("n1")]) == 1
    assert calls == ["read"]
    assert await store.release([keys.claim("c", "c-1")], known=[keys.used("n0")]) == 1  # wrong node: re-read
    assert calls == ["read", "read"]
    used = await redis.hgetall(keys.used("n1"))
    assert int(used["g0.milli"]) == int(used_before["g0.milli"]) - 1000
    assert int(used["g1.milli"]) == int(used_before["g1.milli"]) - 500


def count_reads(store: ClaimStore) -> list[str]:
    """What the store reads before its scripts (lapsed reservations, the claims' keys), as it reads them."""
    reads: list[str] = []
    lapsed, touched = store._lapsed, store._touched

    async def counted_lapsed(*args: object) -> dict[str, str]:
        reads.append("lapsed")
        return await lapsed(*args)  # type: ignore[arg-type]

    async def counted_touched(*args: object) -> list[str]:
        reads.append("keys")
        return await touched(*args)  # type: ignore[arg-type]

    store._lapsed, store._touched = counted_lapsed, counted_touched  # type: ignore[method-assign]
    return reads


async def test_a_cycle_s_claims_and_hinted_commits_read_nothing_before_their_script(redis: Redis) -> None:
    store = await fresh(redis)
    reads = count_reads(store)
    assert [ok for ok, _ in await store.reserve_many([GANGS[0], GANGS[2]], 30_000, lapsing=[])] == [True, True]
    await redis.set(keys.job("a"), "reserved")
    a_keys = tuple(c.key for c in GANGS[0][0]) + (keys.used("n0"), keys.used("n1"))
    assert await store.write_records([RecordWrite("a", "reserved", "committed", commit="a:1", touches=a_keys)]) == [
        WRITTEN]
    assert reads == []
    assert [ok for ok, _ in await store.reserve_many([GANGS[4]], 30_000)] == [True]  # lapses unknown: looked up
    assert reads == ["lapsed", "keys"]


async def test_a_reservation_named_lapsing_is_released_before_the_claims(redis: Redis) -> None:
    store = await fresh(redis)
    assert [ok for ok, _ in await store.reserve_many([GANGS[0]], 30_000)] == [True]
    await redis.zadd(keys.RESERVATIONS, {"a:1": 1})  # lapsed long ago
    # b wants a's GPU: refused while a's lapsed reservation holds it unseen, granted once it is named
    assert [ok for ok, _ in await store.reserve_many([GANGS[1]], 30_000, lapsing=[])] == [False]
    assert [ok for ok, _ in await store.reserve_many([GANGS[1]], 30_000, lapsing=["a:1"])] == [True]
    assert await redis.lrange(keys.EXPIRED_RESERVATIONS, 0, -1) == ["a:1"]


async def test_records_are_written_with_their_claims_released_or_neither(redis: Redis) -> None:
    store = await fresh(redis)
    await store.reserve_many([GANGS[0], GANGS[2]], 30_000)
    assert await store.commit("a:1") and await store.commit("c:1")
    await redis.set(keys.job("a"), "a-v1")
    await redis.set(keys.job("c"), "c-v1")
    a0, a1 = (c.key for c in GANGS[0][0])
    c0 = GANGS[2][0][0].key
    used_before = await redis.hgetall(keys.used("n0"))
    written = await store.write_records([
        RecordWrite("a", "a-v1", "a-v2", (a0,), touches=(keys.used("n0"),)),
        RecordWrite("c", "c-v0", "c-v2", (c0,), touches=(keys.used("n0"),)),  # c's record moved on: nothing done
        # the same job again on the same expected record: refused; a1's node missing from the hint: read, run again
        RecordWrite("a", "a-v1", "a-v3", (a1,), touches=(keys.used("n0"),)),
    ])
    assert written == [WRITTEN, RECORD_CHANGED, RECORD_CHANGED]
    assert await redis.get(keys.job("a")) == "a-v2" and await redis.get(keys.job("c")) == "c-v1"
    assert set(await redis.smembers(keys.CLAIMS_INDEX)) == {a1, c0, GANGS[2][0][1].key}
    used = await redis.hgetall(keys.used("n0"))
    assert int(used["g0.milli"]) == int(used_before["g0.milli"]) - 1000
    assert int(used["g1.milli"]) == int(used_before["g1.milli"])


async def test_a_reservation_is_committed_exactly_when_its_record_is_written(redis: Redis) -> None:
    store = await fresh(redis)
    await store.reserve_many([GANGS[0], GANGS[2]], 30_000)
    for job in ("a", "c"):
        await redis.set(keys.job(job), f"{job}-reserved")
    reads = count_reads(store)
    a_touches = tuple(c.key for c in GANGS[0][0]) + (keys.used("n0"), keys.used("n1"))
    assert await store.write_records([
        RecordWrite("a", "a-reserved", "a-committed", commit="a:1", touches=a_touches),
        RecordWrite("c", "c-changed", "c-committed", commit="c:1", touches=()),  # c's record moved on
    ]) == [WRITTEN, RECORD_CHANGED]
    assert reads == ["keys"]  # c named none of its keys: read once, then the script ran again
    used, claims, held = await state(redis)
    assert held == ["c:1"] and await redis.get(keys.job("c")) == "c-reserved"
    assert {k: v for k, v in claims.items() if k.startswith(keys.claim("a", ""))} == {
        c.key: "" for c in GANGS[0][0]}  # a's slots are permanent
    # sent again after a lost reply: the record is the one it wrote, so it is not mistaken for a lapse
    assert await store.write_records([RecordWrite("a", "a-reserved", "a-committed", commit="a:1")]) == [
        RECORD_CHANGED]
    await redis.zadd(keys.RESERVATIONS, {"c:1": 1})  # c's reservation lapsed
    assert await store.write_records([RecordWrite("c", "c-reserved", "c-committed", commit="c:1")]) == [
        RESERVATION_LAPSED]
    used, claims, held = await state(redis)
    assert held == [] and await redis.get(keys.job("c")) == "c-reserved"
    assert not any(k.startswith(keys.claim("c", "")) for k in claims)  # released with the lapse
    assert await redis.lrange(keys.EXPIRED_RESERVATIONS, 0, -1) == ["c:1"]


async def test_a_fenced_record_write_releases_nothing(redis: Redis) -> None:
    store = await fresh(redis)
    await store.reserve_many([GANGS[0]], 30_000)
    await redis.set(keys.job("a"), "a-v1")
    await redis.set(keys.PLACER_LEADER, "other")
    fenced = ClaimStore(redis, fence=lambda: "mine")
    with pytest.raises(FencedOut):
        await fenced.write_records([RecordWrite("a", "a-v1", "a-v2", (GANGS[0][0][0].key,))])
    with pytest.raises(FencedOut):
        await fenced.write_records([RecordWrite("a", "a-v1", "a-v2", commit="a:1")])
    assert await redis.get(keys.job("a")) == "a-v1"
    assert len(await redis.smembers(keys.CLAIMS_INDEX)) == 2 and await redis.zrange(keys.RESERVATIONS, 0, -1)


async def test_a_reservation_and_the_record_naming_it_are_one_write(redis: Redis) -> None:
    store = await fresh(redis)
    for job, score in (("a", 1.0), ("b", 2.0), ("c", 3.0)):
        await redis.set(keys.job(job), f"{job}-pending")
        await redis.zadd(keys.PENDING, {job: score})
    out = await store.reserve_many([GANGS[0], GANGS[1], GANGS[2]], 30_000, lapsing=[], records=[
        RecordWrite("a", "a-pending", "a-reserved", dequeue=True),
        RecordWrite("b", "b-pending", "b-reserved", dequeue=True),  # a's GPU: refused, its record untouched
        RecordWrite("c", "c-changed", "c-reserved", dequeue=True),  # c's record moved on: nothing claimed
    ])
    assert out == [(True, "ok"), (False, out[1][1]), (False, RECORD_CHANGED_WHY)]
    assert "insufficient" in out[1][1]
    assert [await redis.get(keys.job(j)) for j in "abc"] == ["a-reserved", "b-pending", "c-pending"]
    assert await redis.zrange(keys.PENDING, 0, -1) == ["b", "c"]
    _, claims, held = await state(redis)
    assert held == ["a:1"] and sorted(claims) == sorted(c.key for c in GANGS[0][0])
