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
