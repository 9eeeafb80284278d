"""Redis connection with retries, so a restarted Redis does not kill a service."""

from __future__ import annotations

from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff
from redis.exceptions import ConnectionError, TimeoutError


def connect_redis(url: str) -> Redis:
    return Redis.from_url(
        url,
        decode_responses=True,
        retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries=30),
        retry_on_error=[ConnectionError, TimeoutError],
        health_check_interval=10,
        socket_connect_timeout=2,
    )
