"""The metrics poll's read (``tide.store.usage``): what the single commands would answer, whatever the chunking."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis
from tide.store import keys, usage
from tide.store.usage import UsageReader


@pytest.mark.parametrize("chunk", [1, 2, 3, 250])
async def test_the_read_answers_as_single_commands_would(redis: Redis, chunk: int,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(usage, "CHUNK_KEYS", chunk)  # chunks that split the hashes, the claims and both
    await redis.hset(keys.used("n1"), mapping={"g0.milli": 1000, "g0.mem": 81920, "cpu": 2000})
    await redis.hset(keys.used("n2"), mapping={"g3.slot1": 1})
    await redis.hset(keys.WEIGHTS, mapping={"fam-a": json.dumps({"mem": 1.5}), "fam-b": "{}"})
    claims = [keys.claim(f"j{i}", f"j{i}-0") for i in range(3)]
    for i, key in enumerate(claims[:2]):
        await redis.hset(key, mapping={"alloc": json.dumps({"node_id": f"n{i + 1}"}), "items": "[]"})
    node_ids = ["n1", "n2", "n3"]  # n3: never used, no hash

    read = await UsageReader(redis).read(node_ids, claims)  # j2's claim is gone

    assert read.used == [await redis.hgetall(keys.used(n)) for n in node_ids]
    assert read.used[2] == {} and read.used[0]["g0.milli"] == "1000"
    assert read.allocs == [await redis.hget(key, "alloc") for key in claims]
    assert read.allocs[2] is None and json.loads(read.allocs[1] or "")["node_id"] == "n2"
    assert read.weights == await redis.hgetall(keys.WEIGHTS)


async def test_an_empty_cluster_reads_nothing_but_the_weights(redis: Redis) -> None:
    read = await UsageReader(redis).read([], [])
    assert read.used == [] and read.allocs == [] and read.weights == {}
