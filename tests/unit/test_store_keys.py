"""The key codec: every key carries the {tide} hash tag, and what it builds it parses back."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis
from redis.cluster import key_slot
from tide.stack.auth import redis_acl_lines
from tide.store import keys
from tide.store.claims import BASE_KEYS, ClaimItem, ClaimStore, PodClaim

from tests.helpers import small_node

BUILT = [
    keys.job("j-1"), keys.node("n1"), keys.capacity("n1"), keys.used("n1"), keys.claim("j-1", "j-1-0"),
    keys.reservation("j-1:2"), keys.rejected("j-1"), keys.feedback_done("j-1", "oom"),
    keys.JOBS_INDEX, keys.PENDING, keys.CANCELLING, keys.NODES, keys.NODES_VERSION, keys.LOST_NODES,
    keys.NODE_LEASES, keys.CLAIMS_INDEX, keys.RESERVATIONS, keys.EXPIRED_RESERVATIONS, keys.QUEUE_CONFIG,
    keys.WEIGHTS, keys.PLACER_LEADER, keys.FEEDBACK_LOG,
]


def test_every_key_has_the_hash_tag_and_one_slot() -> None:
    assert all(k.startswith("{tide}:") for k in BUILT)
    assert {key_slot(k.encode()) for k in BUILT} == {key_slot(b"tide")}
    assert len(set(BUILT)) == len(BUILT)


def test_claim_keys_round_trip() -> None:
    for job_id, pod in [("a", "a-0"), ("llama-ft-1", "llama-ft-1-12"), ("x", "x-0-extra")]:
        assert keys.parse_claim(keys.claim(job_id, pod)) == (job_id, pod)
    assert keys.parse_reservation_id(keys.reservation_id("gang-7", 3)) == ("gang-7", 3)
    assert keys.parse_used(keys.used("node-3")) == "node-3"


@pytest.mark.parametrize("bad", ["tide:claim:a:a-0", "{tide}:claim:a", "{tide}:claim::a-0", "{tide}:job:a",
                                 "{tide}:claim:a:"])
def test_parse_claim_refuses_other_keys(bad: str) -> None:
    with pytest.raises(ValueError):
        keys.parse_claim(bad)


@pytest.mark.parametrize("bad", ["a", "a:", ":3", "a:b"])
def test_parse_reservation_id_refuses_others(bad: str) -> None:
    with pytest.raises(ValueError):
        keys.parse_reservation_id(bad)


def test_acl_limits_services_to_the_tagged_keys() -> None:
    lines = redis_acl_lines({"queue": "q", "placer": "p", "metrics": "m"})
    assert all(" ~{tide}:* " in line for line in lines if line.startswith(("user queue", "user placer",
                                                                              "user metrics")))
    assert not any("~tide:*" in line for line in lines)


async def test_a_script_never_touches_a_key_it_was_not_given(redis: Redis) -> None:
    """The claim script, given only its base keys, names the first key it lacks and writes nothing."""
    store = ClaimStore(redis)
    request = {"rkeys": {}, "resv": "", "rkey": "", "ttl_ms": 0,
               "claims": [{"key": keys.claim("a", "a-0"), "alloc": "{}",
                           "items": [[keys.capacity("n1"), keys.used("n1"), "cpu", 1]]}]}
    code, missing = await store._claim(keys=BASE_KEYS, args=["", json.dumps(request)])
    assert (code, missing) == (-1, keys.claim("a", "a-0"))
    assert await redis.dbsize() == 0


async def test_a_claim_that_changed_under_the_read_is_read_again(redis: Redis) -> None:
    """release names the used keys it read; when the claim moved to another node before the script ran, the
    script touches nothing, says which key it lacks, and the store reads again and releases the new claim."""
    store = ClaimStore(redis)
    for node_id in ("n1", "n2"):
        await store.set_capacity(small_node(node_id, gpus=1))
    on = {"n1": PodClaim("a", "a-0", (ClaimItem("n1", "g0.milli", 1000),), {}),
          "n2": PodClaim("a", "a-0", (ClaimItem("n2", "g0.milli", 1000),), {})}
    assert (await store.claim([on["n1"]]))[0]
    read = store._touched
    reads = 0

    async def racing(reservation_keys: list[str], claim_keys: list[str]) -> list[str]:
        nonlocal reads
        reads += 1
        found = await read(reservation_keys, claim_keys)
        if reads == 1:  # another attempt of the job moves its claim from n1 to n2 meanwhile
            await ClaimStore(redis).release([on["n1"].key])
            assert (await ClaimStore(redis).claim([on["n2"]]))[0]
        return found

    store._touched = racing  # type: ignore[method-assign]
    assert await store.release([on["n1"].key]) == 1
    assert reads == 2
    assert await store.used("n1") == {"g0.milli": 0} and await store.used("n2") == {"g0.milli": 0}
    assert not await redis.exists(on["n1"].key)
