"""Every Lua script of tide/store/lua, through the store's functions, on a 3-shard Valkey cluster: the same
results as on a single server. All keys carry the ``{tide}`` hash tag, so every script's keys share one slot
(compatibility with Redis Cluster, not sharding)."""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.cluster import key_slot
from tide.schemas.events import JobRecord
from tide.schemas.job import JobSpec
from tide.stack.servers import free_port, redis_server_binary, wait_tcp
from tide.store import keys
from tide.store.claims import ClaimItem, ClaimStore, FencedOut, PodClaim, RecordWrite
from tide.store.jobs import JobStore
from tide.store.lease import LeaderLease
from tide.store.usage import UsageReader

from tests.helpers import job, small_node

HOST = "127.0.0.1"
SLOTS = 16384


@pytest.fixture
def cluster_ports(tmp_path: Path) -> Iterator[list[int]]:
    """Three valkey-server primaries with ``cluster-enabled``, slots split in three, met by hand."""
    ports = [free_port() for _ in range(3)]
    bus_ports = [free_port() for _ in range(3)]  # the default (port + 10000) may not exist
    procs = []
    for port, bus_port in zip(ports, bus_ports, strict=True):
        work = tmp_path / f"shard-{port}"
        work.mkdir()
        procs.append(subprocess.Popen(
            [redis_server_binary(), "--port", str(port), "--bind", HOST, "--cluster-enabled", "yes",
             "--cluster-port", str(bus_port),
             "--cluster-config-file", str(work / "nodes.conf"), "--cluster-node-timeout", "2000",
             "--save", "", "--appendonly", "no", "--dir", str(work)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports:
            wait_tcp(HOST, port)
        asyncio.run(_form_cluster(ports, bus_ports))
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)


async def _form_cluster(ports: list[int], bus_ports: list[int]) -> None:
    clients = [Redis(host=HOST, port=p, decode_responses=True) for p in ports]
    try:
        bounds = [SLOTS * i // len(ports) for i in range(len(ports) + 1)]
        for i, client in enumerate(clients):
            await client.execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
        for port, bus_port in zip(ports[1:], bus_ports[1:], strict=True):
            await clients[0].execute_command("CLUSTER", "MEET", HOST, port, bus_port)
        deadline = time.monotonic() + 20
        while True:
            infos = [await c.execute_command("CLUSTER", "INFO") for c in clients]
            if all("cluster_state:ok" in i and "cluster_known_nodes:3" in i for i in infos):
                return
            assert time.monotonic() < deadline, infos
            await asyncio.sleep(0.1)
    finally:
        for client in clients:
            await client.aclose()


def claim(job_id: str, pod: str, *items: tuple[str, str, int]) -> PodClaim:
    return PodClaim(job_id, pod, tuple(ClaimItem(*i) for i in items), {"node_id": items[0][0]})


async def scenario(r: Any) -> list[Any]:
    """Every script (claim, commit, extend, release, expire, cas, create_job, lease renew/release, read_usage) with its
    outcomes."""
    out: list[Any] = []
    store = ClaimStore(r)
    for node_id in ("n1", "n2"):
        await store.set_capacity(small_node(node_id, gpus=2))
    # claim.lua: plain claims, all-or-nothing, already claimed
    out.append(await store.claim([claim("a", "a-0", ("n1", "g0.milli", 1000), ("n1", "cpu", 1000))]))
    out.append(await store.claim([claim("b", "b-0", ("n2", "g0.milli", 1000)),
                                  claim("b", "b-1", ("n1", "g0.milli", 1000))]))
    out.append(await store.claim([claim("a", "a-0", ("n2", "g1.milli", 1000))]))
    # a gang reservation committed (commit.lua)
    out.append(await store.reserve([claim("g", "g-0", ("n1", "g1.milli", 1000)),
                                    claim("g", "g-1", ("n2", "g0.milli", 1000))], "g:1", 30_000))
    out.append(await store.commit("g:1"))
    # a reservation that lapses: its commit is refused and expire.lua hands its id over once
    out.append(await store.reserve([claim("l", "l-0", ("n2", "g1.milli", 500))], "l:1", 150))
    await asyncio.sleep(0.4)
    out.append(await store.commit("l:1"))
    out.append(await store.expire())
    out.append(await store.expire())
    # extend.lua: a held reservation outlives its first TTL; a lapsed one is not revived
    out.append(await store.reserve([claim("x", "x-0", ("n1", "cpu", 500))], "x:1", 300))
    out.append(await store.extend("x:1", 30_000))
    await asyncio.sleep(0.4)
    out.append(await store.commit("x:1"))
    out.append(await store.extend("l:1", 30_000))
    # a lapsed reservation is released by the next claim (its keys named to the script) before it counts
    out.append(await store.reserve([claim("m", "m-0", ("n2", "g1.milli", 1000))], "m:1", 150))
    await asyncio.sleep(0.4)
    out.append(await store.claim([claim("n", "n-0", ("n2", "g1.milli", 1000))]))
    out.append(await store.expire())
    out.append(sorted(await r.smembers(keys.CLAIMS_INDEX)))
    # release.lua: claims and a live reservation, idempotent
    out.append(await store.reserve([claim("q", "q-0", ("n2", "cpu", 2000))], "q:1", 30_000))
    out.append(await store.release([keys.claim("q", "q-0"), keys.claim("a", "a-0")], "q:1"))
    out.append(await store.release([keys.claim("a", "a-0")]))
    out.append([await store.used(n) for n in ("n1", "n2")])
    out.append(await store.reservations())
    # claim_many.lua: several gangs in one call, each all or nothing, in order; record_writes.lua: records written
    # with a reservation's commit or a claim's release, each only on the record it expects
    out.append(await store.reserve_many([([claim("s", "s-0", ("n1", "cpu", 1000))], "s:1"),
                                         ([claim("t", "t-0", ("n1", "cpu", 10**9))], "t:1"),
                                         ([claim("u", "u-0", ("n2", "cpu", 1000))], "u:1")], 30_000))
    for j in ("s", "u"):
        await r.set(keys.job(j), "reserved")
    out.append(await store.write_records([RecordWrite("s", "reserved", "committed", commit="s:1"),
                                          RecordWrite("u", "other", "committed", commit="u:1")]))
    out.append(await store.write_records([RecordWrite("s", "committed", "exited", release=(keys.claim("s", "s-0"),)),
                                          RecordWrite("u", "reserved", "committed", commit="u:1")]))
    out.append([await r.get(keys.job(j)) for j in ("s", "u")] + [await store.reservations()])
    out.append([await store.used(n) for n in ("n1", "n2")])
    # create_job.lua and cas.lua (with and without dequeue)
    jobs = JobStore(r)
    record = JobRecord(job_id="j1", spec=JobSpec.model_validate(job("j1", ["true"])), submitted_at=0, updated_at=0)
    out.append(await jobs.create(record, 1.0))
    out.append(await jobs.create(record, 1.0))

    def rename(rec: JobRecord) -> bool:
        rec.reason = "changed"
        return True

    changed = await jobs.change("j1", rename, dequeue=True)
    out.append(changed[0].reason if changed else None)
    out.append(await jobs.pending())
    # the leader lease (SET NX PX, lease_renew.lua, lease_release.lua) and fencing by its token
    lease = LeaderLease(r, keys.PLACER_LEADER, "t", ttl_s=3.0, renew_s=1.0)
    other = LeaderLease(r, keys.PLACER_LEADER, "u", ttl_s=3.0, renew_s=1.0)
    await lease.step()
    await other.step()
    out.append((lease.leading(), other.leading()))
    await lease.step()
    out.append(lease.leading())
    fenced = ClaimStore(r, fence=lambda: other.token)
    try:
        await fenced.claim([claim("f", "f-0", ("n1", "cpu", 1))])
        out.append("not fenced")
    except FencedOut:
        out.append("fenced")
    leader = ClaimStore(r, fence=lambda: lease.token)
    out.append(await leader.claim([claim("f", "f-0", ("n1", "cpu", 1))]))
    try:
        await JobStore(r, fence=lambda: other.token).change("j1", rename)
        out.append("not fenced")
    except FencedOut:
        out.append("fenced")
    out.append(await lease.release())
    await other.step()
    out.append(other.leading())
    # read_usage.lua: the metrics poll's read (used hashes, claims' allocations, a released claim, the weights)
    await r.hset(keys.WEIGHTS, "fam", "{}")
    usage = await UsageReader(r).read(["n1", "n2", "n9"], [*sorted(await r.smembers(keys.CLAIMS_INDEX)),
                                                          keys.claim("gone", "gone-0")])
    out.append((usage.used, usage.allocs, usage.weights))
    return out


async def test_every_script_runs_on_a_three_shard_cluster(cluster_ports: list[int], redis: Redis) -> None:
    assert {key_slot(k.encode()) for k in (keys.job("x"), keys.claim("x", "x-0"), keys.used("n"),
                                            keys.reservation("x:1"), keys.PLACER_LEADER, keys.PENDING)} == {
        key_slot(b"{tide}")}
    cluster = RedisCluster(host=HOST, port=cluster_ports[0], decode_responses=True)
    try:
        await cluster.initialize()
        assert len(cluster.get_primaries()) == 3
        on_cluster = await scenario(cluster)
    finally:
        await cluster.aclose()
    single = await scenario(redis)
    assert on_cluster == single
    print("\ncluster results:", on_cluster)
    assert on_cluster[:3] == [(True, "ok"), (False, on_cluster[1][1]), (False, on_cluster[2][1])]
    assert "insufficient g0.milli" in on_cluster[1][1] and "already claimed" in on_cluster[2][1]
    assert on_cluster[6:9] == [False, ["l:1"], []]


async def test_extend_keeps_a_held_reservation_and_never_revives_a_lapsed_one(redis: Redis) -> None:
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=1))
    assert (await store.reserve([claim("x", "x-0", ("n1", "g0.milli", 1000))], "x:1", 300))[0]
    assert await store.extend("x:1", 30_000)
    await asyncio.sleep(0.5)
    assert await store.expire() == []  # past its first TTL, still held
    assert await store.commit("x:1")
    assert (await store.reserve([claim("y", "y-0", ("n1", "cpu", 100))], "y:1", 100))[0]
    await asyncio.sleep(0.3)
    assert not await store.extend("y:1", 30_000)
    assert await store.expire() == ["y:1"]


async def test_revive_takes_over_a_lapsed_reservation_until_a_sweep_released_it(redis: Redis) -> None:
    """A new leader inherits a reservation that lapsed while no placer led: its claims are still held, so it
    gets a fresh TTL (and can be committed); one a sweep released stays gone."""
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=1))
    assert (await store.reserve([claim("x", "x-0", ("n1", "g0.milli", 1000))], "x:1", 100))[0]
    await asyncio.sleep(0.3)
    assert not await store.extend("x:1", 30_000)  # past its TTL: a plain extend refuses
    assert await store.revive("x:1", 30_000)
    assert await store.expire() == []
    assert await store.commit("x:1")
    assert (await store.reserve([claim("y", "y-0", ("n1", "cpu", 100))], "y:1", 100))[0]
    await asyncio.sleep(0.3)
    assert await store.expire() == ["y:1"]
    assert not await store.revive("y:1", 30_000)


async def test_commit_does_not_bring_back_the_claim_of_a_pod_that_ended_before_it(redis: Redis) -> None:
    """A short pod can exit (and release its claim) while its gang's start is being settled, before the commit."""
    store = ClaimStore(redis)
    await store.set_capacity(small_node("n1", gpus=2))
    assert (await store.reserve([claim("s", "s-0", ("n1", "g0.milli", 1000)),
                                 claim("s", "s-1", ("n1", "g1.milli", 1000))], "s:1", 30_000))[0]
    assert await store.release([keys.claim("s", "s-0")]) == 1
    assert await store.commit("s:1")
    assert await redis.exists(keys.claim("s", "s-0")) == 0
    assert list(await store.all_claims()) == [keys.claim("s", "s-1")]
    assert (await store.used("n1")).get("g0.milli", 0) == 0
