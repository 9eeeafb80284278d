"""The metrics poll reads node descriptions again only when a registration bumps the nodes version."""

from __future__ import annotations

from tide.schemas.node import default_h100_node
from tide.settings import Settings
from tide.store import keys
from tide.store.claims import ClaimStore
from tide.store.redis import connect_redis
from tide_metrics.service import MetricsService


async def test_nodes_are_read_again_only_after_a_registration(redis_url: str) -> None:
    svc = MetricsService(Settings(redis_url=redis_url))
    svc.redis = connect_redis(redis_url)
    claims = ClaimStore(svc.redis)
    try:
        await claims.set_capacity(default_h100_node("n1"))
        assert sorted((await svc._inventory()).nodes) == ["n1"]

        await claims.set_capacity(default_h100_node("n2"))  # a registration: seen at the next poll
        first = await svc._inventory()
        assert sorted(first.nodes) == ["n1", "n2"]
        assert first.capacity["n2"] and first.nodes["n2"].node_id == "n2"

        await svc.redis.sadd(keys.NODES, "n3")  # no version bump: the poll keeps what it read
        await svc.redis.set(keys.node("n3"), default_h100_node("n3").model_dump_json())
        assert await svc._inventory() is first

        await claims.set_capacity(default_h100_node("n3"))
        assert sorted((await svc._inventory()).nodes) == ["n1", "n2", "n3"]
    finally:
        await svc.redis.aclose()


async def test_the_poll_computes_free_gpus_again_only_for_changed_nodes(redis_url: str) -> None:
    """A node's free GPUs follow its used hash from poll to poll; one whose hash did not change keeps what the last
    poll computed, until a registration gives the poll a new inventory."""
    svc = MetricsService(Settings(redis_url=redis_url))
    svc.redis = connect_redis(redis_url)
    claims = ClaimStore(svc.redis)
    try:
        for n in ("n1", "n2"):
            await claims.set_capacity(default_h100_node(n))
        await svc._poll()
        first = dict(svc._free)
        assert all(g.whole_free for _, _, free in first.values() for g in free)

        await svc.redis.hset(keys.used("n1"), mapping={"g0.milli": 1000, "g0.mem": 81920, "g5.slot2": 1, "cpu": 8})
        await svc._poll()
        n1 = svc._free["n1"][2]
        assert not n1[0].whole_free and n1[0].milli_free == 0 and n1[0].mem_free_mib == 0
        assert not n1[5].whole_free and n1[5].milli_free == 1000  # a MIG slot taken: not whole, SMs still free
        assert all(g.whole_free for g in n1[1:5] + n1[6:])
        assert svc._free["n2"][2] is first["n2"][2]  # unchanged: not computed again

        await svc.redis.hset(keys.used("n1"), mapping={"g0.milli": 0, "g0.mem": 0, "g5.slot2": 0})  # released
        await svc._poll()
        assert all(g.whole_free for g in svc._free["n1"][2])

        await claims.set_capacity(default_h100_node("n3"))  # a registration: a new inventory, all computed again
        await svc._poll()
        assert sorted(svc._free) == ["n1", "n2", "n3"] and svc._free["n2"][2] is not first["n2"][2]
        assert sum(f.free_gpus for f in svc.snapshot.frag.values()) == 24.0  # three idle 8-GPU nodes
    finally:
        await svc.redis.aclose()
