"""The placer leader lease: the pure rules, the settings check, and the lease and fencing on a real Redis."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from tide.settings import Settings
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, FencedOut, PodClaim
from tide.store.lease import NOT_HELD, LeaderLease, LeaseState, after_renew, after_take, leading, transition

from tests.helpers import small_node


def test_pure_rules() -> None:
    assert not leading(NOT_HELD, 0.0)
    held = after_take(NOT_HELD, "t1", True, sent=10.0, ttl_s=5.0)
    assert held == LeaseState("t1", 15.0) and leading(held, 14.9) and not leading(held, 15.0)
    assert after_take(held, "t2", False, sent=11.0, ttl_s=5.0) == held  # a failed take changes nothing
    assert after_renew(held, True, sent=12.0, ttl_s=5.0) == LeaseState("t1", 17.0)
    assert after_renew(held, False, sent=12.0, ttl_s=5.0) == LeaseState("t1", 0.0)  # someone else's: lost now
    assert [transition(False, True), transition(True, False), transition(True, True), transition(False, False)] == [
        "acquired", "lost", None, None]


def test_ttl_must_be_three_renewals(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDE_PLACER_LEASE_TTL_S", "2.5")
    monkeypatch.setenv("TIDE_PLACER_LEASE_RENEW_S", "1")
    with pytest.raises(ValidationError, match="at least three times"):
        Settings()
    monkeypatch.setenv("TIDE_PLACER_LEASE_TTL_S", "3")
    assert Settings().placer_lease_ttl_s == 3.0
    with pytest.raises(ValueError):
        LeaderLease(None, keys.PLACER_LEADER, "p", ttl_s=2.0, renew_s=1.0)  # type: ignore[arg-type]


async def test_one_holder_renewal_release_and_takeover(redis: Redis) -> None:
    a = LeaderLease(redis, keys.PLACER_LEADER, "a", ttl_s=0.6, renew_s=0.2)
    b = LeaderLease(redis, keys.PLACER_LEADER, "b", ttl_s=0.6, renew_s=0.2)
    await a.step()
    await b.step()
    assert a.leading() and not b.leading()
    assert await redis.get(keys.PLACER_LEADER) == a.state.token
    for _ in range(5):  # renewed past its first TTL
        await asyncio.sleep(0.2)
        await a.step()
        await b.step()
    assert a.leading() and not b.leading()
    await asyncio.sleep(0.7)  # a stops renewing (it died): b takes over after the TTL
    await b.step()
    assert b.leading()
    await a.step()  # a, back: its renewal finds b's token, it is not leading any more
    assert not a.leading()
    assert not await LeaderLease(redis, keys.PLACER_LEADER, "x", 0.6, 0.2).release()  # not ours: kept
    assert await b.release()
    assert await redis.get(keys.PLACER_LEADER) is None


async def test_a_stale_token_writes_nothing(redis: Redis) -> None:
    """The claim, commit, release and expire scripts refuse a token the lease does not hold, before any write."""
    old = LeaderLease(redis, keys.PLACER_LEADER, "old", ttl_s=0.3, renew_s=0.1)
    new = LeaderLease(redis, keys.PLACER_LEADER, "new", ttl_s=3.0, renew_s=1.0)
    await old.step()
    stale = ClaimStore(redis, fence=lambda: old.token)
    await stale.set_capacity(small_node("n1", gpus=2))
    pod = PodClaim("j", "j-0", (ClaimItem("n1", "g0.milli", 1000),), {"node_id": "n1"})
    assert (await stale.reserve([pod], "j:1", 30_000))[0]  # while it leads, it writes
    await asyncio.sleep(0.4)
    await new.step()
    assert new.leading()
    before = {k: await redis.dump(k) for k in sorted(await redis.keys("*")) if k != keys.PLACER_LEADER}
    other = PodClaim("k", "k-0", (ClaimItem("n1", "g1.milli", 1000),), {"node_id": "n1"})
    for call in (stale.claim([other]), stale.commit("j:1"), stale.release([pod.key], "j:1"), stale.expire()):
        with pytest.raises(FencedOut):
            await call
    after = {k: await redis.dump(k) for k in sorted(await redis.keys("*")) if k != keys.PLACER_LEADER}
    assert after == before
    leader = ClaimStore(redis, fence=lambda: new.token)
    assert await leader.commit("j:1")  # the new leader adopts the reservation
