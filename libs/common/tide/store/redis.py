"""Redis connection with retries, so a restarted Redis does not kill a service.

The pool blocks: a command that finds every connection busy waits for one (up to ``POOL_WAIT_S``)
instead of failing. redis-py's default pool raises ``MaxConnectionsError`` once 100 commands are in
flight, which a placer starting a few hundred pods at once reaches.
"""

from __future__ import annotations

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

POOL_SIZE = 32  # connections per service; more only adds contention in a single-threaded Redis
POOL_WAIT_S = 30.0  # a command waits this long for a free connection before it fails


def connect_redis(url: str, pool_size: int = POOL_SIZE) -> Redis:
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=pool_size,
        timeout=POOL_WAIT_S,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=30),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=10,
        socket_connect_timeout=2,
    )
    return Redis.from_pool(pool)
