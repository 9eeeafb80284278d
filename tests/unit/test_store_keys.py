"""The key codec: every key carries the {tide} hash tag, and what it builds it parses back."""

from __future__ import annotations

import json

import pytest
from redis.asyncio import Redis
from redis.cluster import key_slot
from tide.stack.auth import redis_acl_lines
from tide.store import keys
from tide.store.claims import BASE_KEYS, ClaimStore

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
