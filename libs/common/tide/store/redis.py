"""Redis connection with retries, so a restarted Redis does not kill a service.

The pool blocks: a command that finds every connection busy waits for one (up to ``POOL_WAIT_S``)
instead of failing. redis-py's default pool raises ``MaxConnectionsError`` once 100 commands are in
flight, which a placer starting a few hundred pods at once reaches.

High availability (docs/ha.md): with ``TIDE_REDIS_SENTINELS`` set, the master is asked of the Sentinels
before each new connection, so after a failover the retried commands reach the promoted replica. The
URL then gives only the user, password and db. The services connect with ``redis_for(settings)``;
``connect_redis(url)`` alone (scripts, tests) reads the Sentinel settings from the environment.
"""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import unquote, urlparse

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel, SentinelConnectionPool
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError

from tide.settings import Settings

POOL_SIZE = 32  # connections per service; more only adds contention in a single-threaded Redis
POOL_WAIT_S = 30.0  # a command waits this long for a free connection before it fails
SENTINEL_TIMEOUT_S = 1.0  # one Sentinel that does not answer in time: ask the next
SENTINEL_RETRIES = 6  # per round at one address (about 2 s), before the Sentinels are asked again


class BlockingSentinelPool(SentinelConnectionPool, BlockingConnectionPool):
    """Connections to whichever server the Sentinels name as master; waits for a free one like
    ``BlockingConnectionPool`` (the MRO puts the Sentinel lookup first, the blocking pool under it)."""


def _client_options(pool_size: int, retries: int = 30, backoff_cap_s: float = 2.0) -> dict[str, Any]:
    return dict(
        max_connections=pool_size,
        timeout=POOL_WAIT_S,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=backoff_cap_s, base=0.1), retries=retries),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=10,
        socket_connect_timeout=2,
    )


def parse_sentinels(text: str) -> list[tuple[str, int]]:
    """``host:port,host:port`` -> [(host, port), ...]."""
    out: list[tuple[str, int]] = []
    for item in text.split(","):
        if item.strip():
            host, _, port = item.strip().rpartition(":")
            out.append((host, int(port)))
    return out


def connect_redis(
    url: str,
    pool_size: int = POOL_SIZE,
    sentinels: str | None = None,
    master_name: str | None = None,
    sentinel_password: str | None = None,
) -> Redis:
    """A client for the services. ``sentinels`` (default ``$TIDE_REDIS_SENTINELS``) switches to the master
    named ``master_name`` (default ``$TIDE_REDIS_MASTER_NAME`` or ``tide``) at those Sentinels."""
    sentinels = os.environ.get("TIDE_REDIS_SENTINELS", "") if sentinels is None else sentinels
    if not sentinels.strip():
        pool = BlockingConnectionPool.from_url(url, **_client_options(pool_size))
        return Redis.from_pool(pool)
    master_name = master_name or os.environ.get("TIDE_REDIS_MASTER_NAME") or "tide"
    if sentinel_password is None:
        sentinel_password = os.environ.get("TIDE_REDIS_SENTINEL_PASSWORD") or None
    parsed = urlparse(url)
    db = int(parsed.path.lstrip("/") or 0)
    sentinel = Sentinel(
        parse_sentinels(sentinels),
        sentinel_kwargs={"password": sentinel_password, "socket_timeout": SENTINEL_TIMEOUT_S,
                         "socket_connect_timeout": SENTINEL_TIMEOUT_S},
    )
    return sentinel.master_for(
        master_name,
        redis_class=Redis,
        connection_pool_class=BlockingSentinelPool,
        username=unquote(parsed.username) if parsed.username else None,
        password=unquote(parsed.password) if parsed.password else None,
        db=db,
        # redis-py retries a connection to the address it resolved with the same Retry, nested inside the
        # retry that asks the Sentinels again: a long inner retry keeps knocking at the dead master for
        # ~50 s after the failover (the placer's cycle hung that long). Short: each round re-resolves.
        **_client_options(pool_size, retries=SENTINEL_RETRIES, backoff_cap_s=0.5),
    )


def redis_for(settings: Settings) -> Redis:
    """``connect_redis`` with everything taken from ``settings`` (Sentinels included) instead of the environment."""
    return connect_redis(settings.redis_url, sentinels=settings.redis_sentinels,
                         master_name=settings.redis_master_name, sentinel_password=settings.redis_sentinel_password)
