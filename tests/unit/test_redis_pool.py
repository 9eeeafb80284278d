"""The services' Redis client waits for a free connection instead of failing under a burst."""

from __future__ import annotations

import asyncio

from tide.store.redis import connect_redis


async def test_burst_beyond_the_pool_waits_instead_of_failing(redis_url: str) -> None:
    r = connect_redis(redis_url, pool_size=4)
    try:
        # 300 concurrent blocking commands on 4 connections: each must wait its turn, none may raise
        # (redis-py's default pool raises MaxConnectionsError past its limit).
        results = await asyncio.gather(*[r.incr("burst") for _ in range(300)])
        assert sorted(results) == list(range(1, 301))
        assert len(r.connection_pool._in_use_connections) == 0
        assert await r.get("burst") == "300"
    finally:
        await r.aclose()
