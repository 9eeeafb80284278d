"""The HA server configs and client settings, without servers (fast)."""

from __future__ import annotations

import pytest
from tide.bus.nats import nats_servers, stream_replicas
from tide.stack.auth import (
    REPLICATION_USER,
    ROUTE_USER,
    SENTINEL_USER,
    NatsCluster,
    nats_config,
    redis_acl_lines,
)
from tide.stack.servers import redis_config, sentinel_config
from tide.store.redis import BlockingSentinelPool, connect_redis, parse_sentinels

PASSWORDS = {"queue": "q", "placer": "p", "metrics": "m", "admin": "a", ROUTE_USER: "r", REPLICATION_USER: "x",
             SENTINEL_USER: "s"}


def test_nats_cluster_config_authenticates_routes_and_keeps_users() -> None:
    conf = nats_config(4001, "/tmp/s", PASSWORDS, [], cluster=NatsCluster("tide-2", 5002, [5001, 5003], 8002))
    assert "server_name: tide-2" in conf
    assert f'authorization {{ user: "{ROUTE_USER}", password: "r"' in conf
    assert f"nats-route://{ROUTE_USER}:r@127.0.0.1:5001" in conf and "127.0.0.1:5003" in conf
    assert '"user": "placer"' in conf and "jetstream" in conf
    single = nats_config(4001, "/tmp/s", PASSWORDS, [])
    assert "server_name: tide" in single and "cluster" not in single and "http:" not in single


def test_redis_ha_acl_and_replication() -> None:
    lines = redis_acl_lines(PASSWORDS, ha=True)
    assert lines[0] == "user default off"
    assert any(line.startswith(f"user {REPLICATION_USER} on >x +psync") for line in lines)
    assert any(line.startswith(f"user {SENTINEL_USER} on >s") and "+slaveof" in line for line in lines)
    assert not any(REPLICATION_USER in line for line in redis_acl_lines(PASSWORDS))
    conf = redis_config(6001, "/tmp/r", lines, replication=(REPLICATION_USER, "x"), replica_of=6000)
    assert "appendfsync everysec" in conf and "appendonly yes" in conf
    assert f"masteruser {REPLICATION_USER}" in conf and "masterauth x" in conf and "replicaof 127.0.0.1 6000" in conf
    sentinel = sentinel_config(7001, "/tmp/s1", "tide", 6000, "sp", (SENTINEL_USER, "s"))
    assert "requirepass sp" in sentinel and "sentinel monitor tide 127.0.0.1 6000 2" in sentinel
    assert f"sentinel auth-user tide {SENTINEL_USER}" in sentinel and "sentinel auth-pass tide s" in sentinel


def test_client_settings_parse_several_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nats_servers("nats://a:1, nats://b:2,") == ["nats://a:1", "nats://b:2"]
    assert parse_sentinels("127.0.0.1:1,127.0.0.1:2") == [("127.0.0.1", 1), ("127.0.0.1", 2)]
    monkeypatch.delenv("TIDE_NATS_STREAM_REPLICAS", raising=False)
    assert stream_replicas() == 1
    monkeypatch.setenv("TIDE_NATS_STREAM_REPLICAS", "3")
    assert stream_replicas() == 3


async def test_connect_redis_uses_the_sentinels_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIDE_REDIS_SENTINELS", "127.0.0.1:1,127.0.0.1:2")
    monkeypatch.setenv("TIDE_REDIS_MASTER_NAME", "m")
    client = connect_redis("redis://queue:pw@127.0.0.1:9/0")
    try:
        pool = client.connection_pool
        assert isinstance(pool, BlockingSentinelPool) and pool.service_name == "m"
        assert pool.connection_kwargs["username"] == "queue" and pool.connection_kwargs["password"] == "pw"
    finally:
        await client.aclose()
    monkeypatch.setenv("TIDE_REDIS_SENTINELS", "")
    plain = connect_redis("redis://queue:pw@127.0.0.1:9/0")
    assert not isinstance(plain.connection_pool, BlockingSentinelPool)
    await plain.aclose()
